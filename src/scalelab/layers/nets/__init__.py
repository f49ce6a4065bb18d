"""Model architectures and the on-disk model repository layout, shared by train, serve and model.

Parts never import each other; they share these definitions and exchange models as files.
"""
