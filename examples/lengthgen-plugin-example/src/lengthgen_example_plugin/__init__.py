"""Example lengthgen plugin: one attention backend (``relu2``) and one task (``parity``).

Nothing here registers anything at import time; ``pyproject.toml`` names both classes as entry
points and lengthgen imports them only when someone lists or asks for them.
"""

__version__ = "0.1.0"
