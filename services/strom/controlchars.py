"""Control characters (C0, DEL, C1): no name needs them, and printed raw they garble a
terminal and tab-separated output. One definition for the coordinator, which refuses ids
holding them, and the CLI, which escapes them in names older coordinators stored."""

from __future__ import annotations

import re

#: The control characters as a regex character-class body.
CONTROL_CHARS = r"\x00-\x1f\x7f-\x9f"
#: One control character.
CONTROL = re.compile(f"[{CONTROL_CHARS}]")
