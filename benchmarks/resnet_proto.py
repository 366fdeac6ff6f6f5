"""Deploy prototxts of Kaiming He's Caffe ResNets (50, 101, 152) in the ResNet-50 file's pattern.

There is no ResNet-152 in ../shared/models; this writes one layer for layer as the published
ResNet-50/101/152 deploy files are laid out (conv + BatchNorm(use_global_stats) + Scale +
ReLU, bottleneck blocks with an Eltwise sum, branch1 projections at the first block of each
stage, names res{stage}{block}_branch2{a,b,c}). Depth 50 reproduces ResNet-50-deploy.prototxt's
layer list.
"""

from __future__ import annotations

BLOCKS = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}


def _block_names(stage: int, n: int, depth: int) -> list[str]:
    """res2a, res2b, ... (ResNet-50), or res4a, res4b1 ... res4b35 in the deeper nets."""
    if depth == 50 or n <= 3:
        return [f"{stage}{chr(ord('a') + i)}" for i in range(n)]
    return [f"{stage}a"] + [f"{stage}b{i}" for i in range(1, n)]


def _conv_bn(lines, bottom, name, bn, out, k, s, p, relu):
    lines.append(
        f'layer {{ bottom: "{bottom}" top: "{name}" name: "{name}" type: "Convolution" '
        f"convolution_param {{ num_output: {out} kernel_size: {k} pad: {p} stride: {s} "
        "bias_term: false } }"
    )
    lines.append(
        f'layer {{ bottom: "{name}" top: "{name}" name: "bn{bn}" type: "BatchNorm" '
        "batch_norm_param { use_global_stats: true } }"
    )
    lines.append(
        f'layer {{ bottom: "{name}" top: "{name}" name: "scale{bn}" type: "Scale" '
        "scale_param { bias_term: true } }"
    )
    if relu:
        lines.append(f'layer {{ bottom: "{name}" top: "{name}" name: "{name}_relu" type: "ReLU" }}')


def resnet_prototxt(depth: int = 152, batch: int = 1, size: int = 224) -> str:
    lines = [
        f'name: "ResNet-{depth}"',
        f'input: "data" input_dim: {batch} input_dim: 3 input_dim: {size} input_dim: {size}',
        'layer { bottom: "data" top: "conv1" name: "conv1" type: "Convolution" '
        "convolution_param { num_output: 64 kernel_size: 7 pad: 3 stride: 2 } }",
        'layer { bottom: "conv1" top: "conv1" name: "bn_conv1" type: "BatchNorm" '
        "batch_norm_param { use_global_stats: true } }",
        'layer { bottom: "conv1" top: "conv1" name: "scale_conv1" type: "Scale" '
        "scale_param { bias_term: true } }",
        'layer { bottom: "conv1" top: "conv1" name: "conv1_relu" type: "ReLU" }',
        'layer { bottom: "conv1" top: "pool1" name: "pool1" type: "Pooling" '
        "pooling_param { kernel_size: 3 stride: 2 pool: MAX } }",
    ]
    bottom = "pool1"
    for stage, n in enumerate(BLOCKS[depth], start=2):
        width = 64 * 2 ** (stage - 2)
        for i, block in enumerate(_block_names(stage, n, depth)):
            res = f"res{block}"
            if i == 0:
                stride = 1 if stage == 2 else 2
                _conv_bn(
                    lines,
                    bottom,
                    f"{res}_branch1",
                    f"{block}_branch1",
                    4 * width,
                    1,
                    stride,
                    0,
                    False,
                )
                shortcut = f"{res}_branch1"
            else:
                stride, shortcut = 1, bottom
            _conv_bn(
                lines, bottom, f"{res}_branch2a", f"{block}_branch2a", width, 1, stride, 0, True
            )
            _conv_bn(
                lines,
                f"{res}_branch2a",
                f"{res}_branch2b",
                f"{block}_branch2b",
                width,
                3,
                1,
                1,
                True,
            )
            _conv_bn(
                lines,
                f"{res}_branch2b",
                f"{res}_branch2c",
                f"{block}_branch2c",
                4 * width,
                1,
                1,
                0,
                False,
            )
            lines.append(
                f'layer {{ bottom: "{shortcut}" bottom: "{res}_branch2c" top: "{res}" '
                f'name: "{res}" type: "Eltwise" }}'
            )
            lines.append(
                f'layer {{ bottom: "{res}" top: "{res}" name: "{res}_relu" type: "ReLU" }}'
            )
            bottom = res
    lines += [
        f'layer {{ bottom: "{bottom}" top: "pool5" name: "pool5" type: "Pooling" '
        "pooling_param { kernel_size: 7 stride: 1 pool: AVE } }",
        'layer { bottom: "pool5" top: "fc1000" name: "fc1000" type: "InnerProduct" '
        "inner_product_param { num_output: 1000 } }",
        'layer { bottom: "fc1000" top: "prob" name: "prob" type: "Softmax" }',
    ]
    return "\n".join(lines) + "\n"
