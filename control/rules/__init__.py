"""The rules of the control loop as pure functions over plain data: read the world (arguments), return the
desired state. No I/O, no asyncio, no API client here; the reconcilers call these and write the differences."""
