"""Typed errors. Every message says what was wrong and what is allowed."""


class FracgpuError(Exception):
    """Base of every error the core raises on bad input."""


class QuantityError(FracgpuError):
    """A Kubernetes quantity string that cannot be read or is out of range."""


class RequestError(FracgpuError):
    """A container's GPU request that breaks a dialect rule."""

    def __init__(self, container: str, field: str, value: object, allowed: str) -> None:
        self.container = container
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f'container "{container}": {field}={value} is not allowed: {allowed}')


class CodecError(FracgpuError):
    """A stored payload (annotation, custom resource, limits file) that cannot be decoded."""

    def __init__(self, what: str, problem: str) -> None:
        self.what = what
        self.problem = problem
        super().__init__(f"{what}: {problem}")
