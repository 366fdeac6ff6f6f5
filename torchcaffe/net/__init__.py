"""The Net compiler: NetParameter -> a torch.nn.Module wired as Caffe wires blobs.

``state`` filters layers by NetState, ``splits`` inserts Caffe's implicit Split layers,
``feeds`` turns data layers into inputs, ``builder`` resolves shapes and creates layers,
``program`` is the compiled step list and ``net`` the module users hold.
"""
