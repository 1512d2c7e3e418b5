"""Pure rendering: data in, self-contained markup out (inline SVG charts), no I/O and no dependency.

Used at the edges (the CLI's HTML reports, the web dashboard); it imports nothing of the service
layer, the API or the adapters, so either edge can draw the same pictures.
"""
