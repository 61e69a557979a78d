"""Names of fastsafetensors' internal machinery (copiers, raw buffers) that
fst has no counterpart for. They exist so that `import` lines of code
written for fastsafetensors succeed; calling or instantiating one raises
fst.UnsupportedError saying so."""
import fst


def placeholder(qualname: str):
    message = (f"{qualname} is fastsafetensors' internal machinery; fst reads files with "
               "its own readers (docs/python.md, 'The fastsafetensors API')")

    class Placeholder:
        def __init__(self, *args, **kwargs):
            raise fst.UnsupportedError(message, -6)

        def __init_subclass__(cls, **kwargs):
            raise fst.UnsupportedError(message, -6)

    Placeholder.__name__ = Placeholder.__qualname__ = qualname.rsplit(".", 1)[-1]
    Placeholder.__doc__ = message
    return Placeholder
