"""How doit shows progress and failures: one line per failure, no traceback
unless COLI_DEBUG=1, and a summary line at the end."""

from __future__ import annotations

import os
from typing import Any

from doit.reporter import ConsoleReporter

__all__ = ["ColiReporter"]


class ColiReporter(ConsoleReporter):  # type: ignore[misc]
    desc = "coli: one line per failure and a summary"

    def __init__(self, outstream: Any, options: Any) -> None:
        super().__init__(outstream, options)
        self.ran: list[str] = []
        self.fresh = 0

    def execute_task(self, task: Any) -> None:
        if task.actions and task.name[0] != "_":
            self.ran.append(task.name)
        super().execute_task(task)

    def skip_uptodate(self, task: Any) -> None:
        if task.actions:
            self.fresh += 1
        super().skip_uptodate(task)

    def add_failure(self, task: Any, fail: Any) -> None:
        self.failures.append({"task": task, "exception": fail})
        msg = fail.get_msg().strip()
        if os.environ.get("COLI_DEBUG") != "1" and "Traceback" in msg:
            last = msg.splitlines()[-1]
            msg = f"internal error: {last} (run with COLI_DEBUG=1 for the traceback)"
        self.write(f"error: {task.name}: {msg}\n")

    def complete_run(self) -> None:
        if os.environ.get("COLI_DEBUG") == "1":
            for result in self.failures:
                self.write(result["exception"].get_msg())
        if self.runtime_errors:
            self.write("\n".join(self.runtime_errors) + "\n")
        failed = len(self.failures)
        if self.ran or failed:
            self.write(f"coli: {len(self.ran)} tasks ran, {self.fresh} up to date, {failed} failed\n")
