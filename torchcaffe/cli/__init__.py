"""``torchcaffe <action>``: the command-line face (actions registered in ``__main__``)."""
