# Type information for the compiled engine module (native/bindings.cpp): every name is typed Any here;
# worker/engine.py is the typed Python face of it.
from typing import Any

def __getattr__(name: str) -> Any: ...
