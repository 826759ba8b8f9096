"""Pages the docs site generates at build time (mkdocs-gen-files): the references, from the code
itself, and the paper figures' images, from ``paper_figs/out/`` where ``figures --gallery``
draws them. Nothing generated is committed under docs/ except the JSON Schema, which editors
fetch by its path (``python -m harness schema --out docs/scenario.schema.json`` rewrites it)."""

from pathlib import Path

import mkdocs_gen_files

from harness.cli_reference import cli_reference_markdown
from harness.scenario.reference import scenario_reference_markdown

ROOT = Path(__file__).resolve().parent.parent

with mkdocs_gen_files.open("reference/cli.md", "w") as page:
    page.write(cli_reference_markdown())
with mkdocs_gen_files.open("reference/scenario.md", "w") as page:
    page.write(scenario_reference_markdown())
for image in sorted((ROOT / "paper_figs" / "out").glob("*.png")):
    with mkdocs_gen_files.open(f"guides/figures/{image.name}", "wb") as copy:
        copy.write(image.read_bytes())
