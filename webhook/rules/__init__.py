"""Pure rules over a pod, its nodes and its quota; admission, state and kubectl use them."""
