"""Models from another library none of us wrote: MONAI's networks for medical images (3D convolutions, transposed
convolutions, instance norms, a vision transformer and a shifted-window transformer over volumes), tiny, built in
code (nothing downloaded), each ``(loss module, inputs)``: a voxel's cross entropy over 2 classes, on a batch of 4
volumes of 16 x 16 x 16 voxels (32 a side where the network halves it 4 or 5 times); the classifier's cross entropy
of 3 classes. Not tuned on.

MONAI's own Dice losses (``monai.losses.DiceCELoss``, ``dice_ce`` below) are refused at capture, in one line naming
``monai/losses/utils.py:45``: they take their reduction's dimensions from ``torch.arange(2, ndim).tolist()``, which
under ``torch.export`` (strict or not) is read from a tensor, so a data-dependent value.

``med:<name>`` with this folder on ``PYTHONPATH`` (``placer train med:unet ...``); the conformance probe:
``PYTHONPATH=. python docs/conformance/others.py --med``. Needs MONAI (not a dependency of placer): ``pip install
--no-deps monai`` keeps the CPU torch.
"""

import torch
import torch.nn.functional as F
from torch import nn

#: Batch, channels in, classes and the side of each volume.
BATCH, CHANNELS, CLASSES, SIDE = 4, 1, 2, 16


class Segmentation(nn.Module):
    """Each voxel's cross entropy of the network's logits against a label volume."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, image, label):
        return F.cross_entropy(self.model(image), label[:, 0])


class DiceCE(nn.Module):
    """MONAI's Dice + cross entropy loss of the network's logits against a label volume."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        from monai.losses import DiceCELoss

        self.model = model
        self.loss = DiceCELoss(to_onehot_y=True, softmax=True)

    def forward(self, image, label):
        return self.loss(self.model(image), label)


class Classification(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, image, label):
        return F.cross_entropy(self.model(image), label)


def _volumes(side: int = SIDE) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    image = torch.randn(BATCH, CHANNELS, side, side, side, generator=g)
    label = torch.randint(0, CLASSES, (BATCH, 1, side, side, side), generator=g)
    return image, label


def _segmenter(net: type, side: int = SIDE, **kw) -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    return Segmentation(net(**kw)).eval(), _volumes(side)


def unet():
    from monai.networks.nets import UNet

    return _segmenter(
        UNet,
        spatial_dims=3,
        in_channels=CHANNELS,
        out_channels=CLASSES,
        channels=(4, 8, 16),
        strides=(2, 2),
        num_res_units=1,
    )


def basic_unet():
    from monai.networks.nets import BasicUNet

    return _segmenter(  # four halvings: 32 voxels a side leaves 2 at the bottom, which its instance norm needs
        BasicUNet, side=32, spatial_dims=3, in_channels=CHANNELS, out_channels=CLASSES, features=(4, 4, 8, 8, 16, 4)
    )


def segresnet():
    from monai.networks.nets import SegResNet

    return _segmenter(
        SegResNet,
        spatial_dims=3,
        in_channels=CHANNELS,
        out_channels=CLASSES,
        init_filters=4,
        blocks_down=(1, 1, 1),
        blocks_up=(1, 1),
        norm=("group", {"num_groups": 2}),
    )


def dynunet():
    from monai.networks.nets import DynUNet

    return _segmenter(
        DynUNet,
        spatial_dims=3,
        in_channels=CHANNELS,
        out_channels=CLASSES,
        kernel_size=[3, 3, 3],
        strides=[1, 2, 2],
        upsample_kernel_size=[2, 2],
        filters=[4, 8, 16],
        res_block=True,
    )


def attention_unet():
    from monai.networks.nets import AttentionUnet

    return _segmenter(
        AttentionUnet,
        spatial_dims=3,
        in_channels=CHANNELS,
        out_channels=CLASSES,
        channels=(4, 8, 16),
        strides=(2, 2),
    )


def unetr():
    from monai.networks.nets import UNETR

    return _segmenter(
        UNETR,
        in_channels=CHANNELS,
        out_channels=CLASSES,
        img_size=SIDE,
        feature_size=4,
        hidden_size=32,
        mlp_dim=64,
        num_heads=4,
        spatial_dims=3,
    )


def swin_unetr():
    from monai.networks.nets import SwinUNETR

    return _segmenter(
        SwinUNETR,
        side=32,
        in_channels=CHANNELS,
        out_channels=CLASSES,
        feature_size=12,
        depths=(1, 1, 1, 1),
        num_heads=(1, 1, 1, 1),
        spatial_dims=3,
        norm_name=("group", {"num_groups": 3}),
    )


def mednext():
    from monai.networks.nets import MedNeXt

    return _segmenter(
        MedNeXt,
        spatial_dims=3,
        in_channels=CHANNELS,
        out_channels=CLASSES,
        init_filters=4,
        blocks_down=(1, 1, 1),
        blocks_bottleneck=1,
        blocks_up=(1, 1, 1),
    )


def densenet():
    from monai.networks.nets import DenseNet

    torch.manual_seed(0)
    net = DenseNet(
        spatial_dims=3,
        in_channels=CHANNELS,
        out_channels=3,
        init_features=8,
        growth_rate=4,
        block_config=(2, 2),
        bn_size=2,
    )
    image, _ = _volumes()
    return Classification(net).eval(), (image, torch.tensor([0, 2, 1, 0]))


def dice_ce():
    """:func:`unet` trained with MONAI's DiceCELoss: refused at capture (see the module's docstring)."""
    model, inputs = unet()
    return DiceCE(model.model).eval(), inputs


MODELS = {
    f.__name__: f
    for f in (unet, basic_unet, segresnet, dynunet, attention_unet, unetr, swin_unetr, mednext, densenet, dice_ce)
}
