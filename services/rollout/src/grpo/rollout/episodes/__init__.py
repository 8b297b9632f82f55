"""Multi-turn, tool-using episodes (docs/multi-turn.md): the tools, the rules of a task's episodes, the runner."""
