char fracgpu_probe(void) { return 'b'; }
