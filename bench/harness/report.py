"""What a run shows and keeps: aligned text tables on stdout (copied to summary.txt) and CSV files."""

import csv
import os
import sys


class Report:
    """Prints tables and notes, and keeps a copy of everything printed in OUT/summary.txt."""

    def __init__(self, out_dir: str):
        self.out_dir = out_dir
        self._summary = open(os.path.join(out_dir, "summary.txt"), "a", encoding="utf-8")

    def close(self) -> None:
        self._summary.close()

    def say(self, text: str = "") -> None:
        print(text, flush=True)
        self._summary.write(text + "\n")
        self._summary.flush()

    def progress(self, text: str) -> None:
        """One line per measured point: on stderr, so stdout stays the tables."""
        print(f"  .. {text}", file=sys.stderr, flush=True)

    def heading(self, text: str) -> None:
        self.say()
        self.say(text)
        self.say("=" * len(text))

    def table(self, title: str, headers: list, rows: list, left: int = 1) -> None:
        """Columns before index `left` are text (left-aligned), the others numbers (right-aligned)."""
        self.say()
        if title:
            self.say(title)
        self.say(format_table(headers, rows, left))

    def csv(self, name: str, headers: list, rows: list) -> str:
        path = os.path.join(self.out_dir, name)
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(headers)
            for row in rows:
                writer.writerow(["" if v is None else v for v in row])
        return path


def format_table(headers: list, rows: list, left: int = 1) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(row):
        parts = []
        for i, cell in enumerate(row):
            parts.append(cell.ljust(widths[i]) if i < left else cell.rjust(widths[i]))
        return "  ".join(parts).rstrip()

    out = [line(cells[0]), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells[1:]]
    return "\n".join(out)


def format_markdown(headers: list, rows: list, left: int = 1) -> str:
    """A Markdown table whose columns are also padded, so it reads the same on a terminal.
    Columns before index `left` are text (left-aligned), the others numbers (right-aligned)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(3, max(len(r[i]) for r in cells)) for i in range(len(headers))]

    def line(row):
        parts = [cell.ljust(widths[i]) if i < left else cell.rjust(widths[i])
                 for i, cell in enumerate(row)]
        return "| " + " | ".join(parts) + " |"

    rule = "|" + "|".join("-" * (w + 2) if i < left else "-" * (w + 1) + ":"
                          for i, w in enumerate(widths)) + "|"
    return "\n".join([line(cells[0]), rule] + [line(r) for r in cells[1:]])
