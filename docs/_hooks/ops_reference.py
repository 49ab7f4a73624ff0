"""MkDocs hook: fills docs/reference/ops.md with the built-in ops, read from the registry at build time,
so the page lists exactly the ops this opforge registers (a new built-in appears without editing it)."""
import html
from collections import Counter
from pathlib import Path

MARKER = "<!-- built-in ops -->"


def _text(value):
    return html.escape(value, quote=False).replace("*", r"\*")


def _section(op, package):
    lines = [f"### `{op.name}`", "", f"`{op.schema}`", "", _text(op.doc or ""), ""]
    devices = Counter(kernel.device for kernel in op.kernels if kernel is not op.reference_kernel)
    kernels = ", ".join(f"{device} ({count} variant{'s' * (count > 1)})" for device, count in sorted(devices.items()))
    facts = [f"kernels: {kernels or 'none (the reference runs)'}"]
    if op.traits:
        facts.append("traits: " + ", ".join(f"`{trait}`" for trait in sorted(op.traits)))
    where = getattr(op, "defined_at", None)
    if where:
        path, _, line = where.rpartition(":")
        try:
            facts.append(f"defined in `opforge/{Path(path).resolve().relative_to(package).as_posix()}`")
        except ValueError:
            pass
    summary = "; ".join(facts)
    lines += [summary[0].upper() + summary[1:] + ".", ""]
    return "\n".join(lines)


def on_page_markdown(markdown, page, config, files):
    if MARKER not in markdown:
        return markdown
    import opforge

    package = Path(opforge.__file__).resolve().parent
    builtins = [op for op in opforge.registered_ops() if "::" not in op.name]
    listing = "\n".join(_section(op, package) for op in builtins)
    return markdown.replace(MARKER, f"{len(builtins)} ops.\n\n{listing}")
