#!/usr/bin/env python3
"""Every #include goes down the layer table, never up (layers_test).

The table is the one in docs/architecture.md ("## Layers"): a layer uses only the layers above it
in that list. A file belongs to the layer of its folder (include/fsdp/<layer>/, src/<layer>/,
kernels/); a project include names a layer the same way ("fsdp/<layer>/...", "src/<layer>/...",
"kernels/..."). An include of a layer listed below the file's own is reported with the file, the
line and both layers, and the check exits 1. A folder of src/ or include/fsdp/ that the table
does not list is an error too, so a new layer cannot slip in unranked.

  python3 scripts/check_layers.py [ROOT]     ROOT: a checkout (default: this one)
"""
import pathlib
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
SOURCES = ('.h', '.cpp', '.cu', '.cuh', '.inc')


def layer_order(root):
    """The layers in the order of docs/architecture.md's table, top (lowest) first."""
    doc = root / 'docs' / 'architecture.md'
    text = doc.read_text(encoding='utf-8')
    section = text.split('\n## Layers', 1)
    if len(section) != 2:
        sys.exit(f'check_layers: {doc}: no "## Layers" section')
    order = []
    for line in section[1].split('\n## ', 1)[0].splitlines():
        m = re.match(r'^\|\s*`?([a-z_]+)`?\s*\|', line)
        if m and m.group(1) not in ('layer',):
            order.append(m.group(1))
    if not order:
        sys.exit(f'check_layers: {doc}: the "## Layers" section has no table of layers')
    return order


def layer_of_path(rel):
    """The layer a file of the checkout belongs to, or None (examples, tests, bench...)."""
    parts = rel.parts
    if parts[0] == 'kernels':
        return 'kernels'
    if parts[0] == 'src' and len(parts) > 2:
        return parts[1]
    if parts[:2] == ('include', 'fsdp') and len(parts) > 3:
        return parts[2]
    return None


def layer_of_include(name):
    parts = name.split('/')
    if parts[0] == 'kernels':
        return 'kernels'
    if parts[0] in ('fsdp', 'src') and len(parts) > 2:
        return parts[1]
    return None


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent.parent)
    order = layer_order(root)
    rank = {name: i for i, name in enumerate(order)}
    problems = []
    for folder in [root / 'src', root / 'include' / 'fsdp']:
        for d in sorted(p for p in folder.iterdir() if p.is_dir()):
            if d.name not in rank:
                problems.append(f'{d.relative_to(root)}/: a layer the table in docs/architecture.md '
                                f'does not list (it lists {", ".join(order)})')
    files = [p for base in ('src', 'include', 'kernels') for p in sorted((root / base).rglob('*'))
             if p.is_file() and p.suffix in SOURCES]
    for path in files:
        rel = path.relative_to(root)
        own = layer_of_path(rel)
        if own not in rank:
            continue
        for lineno, line in enumerate(path.read_text(encoding='utf-8').splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            used = layer_of_include(m.group(1))
            if used in rank and rank[used] > rank[own]:
                problems.append(f'{rel}:{lineno}: the {own} layer includes "{m.group(1)}" of the '
                                f'{used} layer, which the table lists below it')
    for p in problems:
        print(p)
    if problems:
        print(f'check_layers: {len(problems)} include(s) against the layer order '
              f'{" > ".join(order)} (docs/architecture.md)', file=sys.stderr)
        return 1
    print(f'check_layers: {len(files)} files, every include goes down the table '
          f'({" > ".join(order)})')
    return 0


if __name__ == '__main__':
    sys.exit(main())
