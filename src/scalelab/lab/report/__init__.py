"""Reports: the sheet, the verdict and the curves as self-contained HTML, Markdown and JSON."""
