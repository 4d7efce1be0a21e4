"""The autonomy benchmark: its arms on one v0, data and budget (`arms`), and its report (`report`)."""
