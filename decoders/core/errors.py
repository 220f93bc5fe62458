"""One exception family, so callers (CLI, UI, API) can show a clear message instead of a traceback."""


class DecodingLabError(Exception):
    """Base class for every error the project raises on purpose."""


class InvalidInput(DecodingLabError, ValueError):
    """A prompt, budget or parameter the engine cannot run with."""


class UnknownMethod(InvalidInput):
    pass


class InvalidParameter(InvalidInput):
    pass


class ModelLoadError(DecodingLabError):
    """The model id could not be resolved or loaded."""


class TraceError(DecodingLabError, ValueError):
    """A trace file that is not a valid Decoding Lab trace."""
