"""A stateful plug-in tool (docs/multi-turn.md "Plug-in tools"): notes the model writes and reads back within one
episode. `tool_plugins: {notes: "tests.support.notes_tool:notes"}`."""

from __future__ import annotations

from typing import Any


def notes(arguments: dict[str, Any], state: dict[str, Any]) -> str:
    """`{"write": text}` adds a note; `{"read": true}` returns the episode's notes, one per line."""
    if "write" in arguments:
        state.setdefault("notes", []).append(str(arguments["write"]))
        return f"noted ({len(state['notes'])})"
    if arguments.get("read"):
        return "\n".join(state.get("notes", [])) or "no notes"
    raise ValueError('notes takes {"write": "<text>"} or {"read": true}')
