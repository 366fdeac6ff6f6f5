"""``import caffe`` gives torchcaffe (the opt-in shim; see torchcaffe.caffe_alias)."""

from torchcaffe.caffe_alias import install_caffe_alias

install_caffe_alias()  # replaces this module in sys.modules: the import returns torchcaffe
