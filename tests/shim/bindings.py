"""The opening of the cuda-bindings programs the tests run, on the driver double, in tier
pods and on a GPU: the driver module as ``d`` and ``ok(result)``, which asserts
``CUDA_SUCCESS`` and returns the rest of the result."""

from typing import Final

CUDA_BINDINGS_OK: Final = """
from cuda.bindings import driver as d
def ok(result):
    err = result[0] if isinstance(result, tuple) else result
    assert err == d.CUresult.CUDA_SUCCESS, err
    return result[1:] if isinstance(result, tuple) else ()
"""
