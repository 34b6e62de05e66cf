"""Wire schemas (msgspec Structs) and the AsyncAPI document; import from the modules."""

__all__: list[str] = []
