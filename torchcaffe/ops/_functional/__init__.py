"""Custom autograd Functions, only where Caffe's gradient differs from the mathematical one."""
