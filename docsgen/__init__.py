"""The documentation site's reference sections, generated from the code at build time.

The mkdocs hook (`mkdocs_hook.py`, named in mkdocs.yml) replaces each `<!-- generated: NAME -->`
marker in a page with the section `sections.SECTIONS[NAME]` writes. Generation reads only code
(click commands, the FastAPI app's OpenAPI document, the settings model, a metrics registry, the
event emitters' source): no database, no network, the same output on every run.
"""
