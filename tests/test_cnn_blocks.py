"""Every kernel of the suite CNNs' block types gets a schedule (#39): ghostnet_100 once built with 0 of 96 kernels
scheduled (TVM found a ghost module's concat + channel slice ill-formed, and the whole model fell back), 14x slower
than ORT, and nothing failed. Cut-down blocks (tiny channels, 16x16 images) of GhostNet, MobileNetV2, ResNet,
EfficientNet and ConvNeXt, compiled as `mlc compile` does; a model with an unscheduled kernel fails here."""

from __future__ import annotations

import pytest

import mlc.api as api

torch = pytest.importorskip("torch")
nn, F = torch.nn, torch.nn.functional


def _bn_act(channels: int, act=None):
    return [nn.BatchNorm2d(channels)] + ([act] if act is not None else [])


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, reduced: int, act=nn.ReLU, gate=F.hardsigmoid):
        super().__init__()
        self.reduce, self.act, self.expand, self.gate = nn.Conv2d(channels, reduced, 1), act(), \
            nn.Conv2d(reduced, channels, 1), gate

    def forward(self, x):
        return x * self.gate(self.expand(self.act(self.reduce(x.mean((2, 3), keepdim=True)))))


class GhostModule(nn.Module):
    """1x1 primary conv, depthwise cheap conv, concat, channel slice (timm's ghostnet)."""

    def __init__(self, cin: int, cout: int, relu: bool):
        super().__init__()
        self.cout, init = cout, (cout + 1) // 2
        act = nn.ReLU() if relu else None
        self.primary = nn.Sequential(nn.Conv2d(cin, init, 1, bias=False), *_bn_act(init, act))
        self.cheap = nn.Sequential(nn.Conv2d(init, init, 3, 1, 1, groups=init, bias=False), *_bn_act(init, act))

    def forward(self, x):
        x1 = self.primary(x)
        return torch.cat([x1, self.cheap(x1)], 1)[:, :self.cout]


class GhostBottleneck(nn.Module):
    def __init__(self, cin: int, mid: int, cout: int, stride: int, se: bool):
        super().__init__()
        self.ghost1, self.ghost2 = GhostModule(cin, mid, True), GhostModule(mid, cout, False)
        self.dw = nn.Sequential(nn.Conv2d(mid, mid, 3, stride, 1, groups=mid, bias=False), nn.BatchNorm2d(mid)) \
            if stride > 1 else nn.Identity()
        self.se = SqueezeExcite(mid, 8) if se else nn.Identity()
        self.shortcut = nn.Identity() if cin == cout and stride == 1 else nn.Sequential(
            nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False), nn.BatchNorm2d(cin),
            nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        return self.ghost2(self.se(self.dw(self.ghost1(x)))) + self.shortcut(x)


class InvertedResidual(nn.Module):
    """MobileNetV2's (ReLU6), or with SE and swish EfficientNet's MBConv."""

    def __init__(self, cin: int, cout: int, expand: int, stride: int, kernel: int = 3, se: bool = False):
        super().__init__()
        mid, act = cin * expand, (nn.SiLU if se else nn.ReLU6)
        self.body = nn.Sequential(
            nn.Conv2d(cin, mid, 1, bias=False), *_bn_act(mid, act()),
            nn.Conv2d(mid, mid, kernel, stride, kernel // 2, groups=mid, bias=False), *_bn_act(mid, act()),
            SqueezeExcite(mid, max(1, cin // 4), nn.SiLU, torch.sigmoid) if se else nn.Identity(),
            nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.body(x) if self.residual else self.body(x)


class ResNetBlock(nn.Module):
    """Basic (two 3x3) or bottleneck (1x1, 3x3, 1x1) block, with a strided 1x1 downsample where the shape changes."""

    def __init__(self, cin: int, cout: int, stride: int, bottleneck: bool):
        super().__init__()
        mid = cout // 4 if bottleneck else cout
        convs = [(cin, mid, 1, 1), (mid, mid, 3, stride), (mid, cout, 1, 1)] if bottleneck else \
            [(cin, mid, 3, stride), (mid, cout, 3, 1)]
        layers = []
        for i, (a, b, k, s) in enumerate(convs):
            act = nn.ReLU() if i < len(convs) - 1 else None  # the last ReLU comes after the skip
            layers += [nn.Conv2d(a, b, k, s, k // 2, bias=False), *_bn_act(b, act)]
        self.body = nn.Sequential(*layers)
        self.down = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        return F.relu(self.body(x) + self.down(x))


class ConvNeXtBlock(nn.Module):
    """Depthwise 7x7, LayerNorm over channels (channels last), Linear 4x, GELU, Linear, layer scale, residual."""

    def __init__(self, channels: int):
        super().__init__()
        self.dw = nn.Conv2d(channels, channels, 7, padding=3, groups=channels)
        self.norm, self.fc1, self.fc2 = nn.LayerNorm(channels), nn.Linear(channels, 4 * channels), \
            nn.Linear(4 * channels, channels)
        self.scale = nn.Parameter(torch.full((channels,), 0.5))

    def forward(self, x):
        y = self.norm(self.dw(x).permute(0, 2, 3, 1))
        return x + (self.fc2(F.gelu(self.fc1(y))) * self.scale).permute(0, 3, 1, 2)


def _net(*blocks, width: int, stem: int = 16):
    """A stem conv, the blocks, global pooling and a classifier, as the suite's CNNs end."""
    return nn.Sequential(nn.Conv2d(3, stem, 3, 2, 1, bias=False), nn.BatchNorm2d(stem), nn.ReLU(), *blocks,
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 10))


BLOCKS = {
    # 25 channels: 13 + 13 concatenated, then sliced (ghostnet_100's widths are even: its slices keep all)
    "ghostnet": lambda: _net(GhostBottleneck(16, 24, 16, 1, False), GhostBottleneck(16, 36, 25, 2, True), width=25),
    "mobilenetv2": lambda: _net(InvertedResidual(16, 16, 6, 1), InvertedResidual(16, 24, 6, 2), width=24),
    "resnet": lambda: _net(ResNetBlock(16, 16, 1, False), ResNetBlock(16, 32, 2, True), width=32),
    "efficientnet": lambda: _net(InvertedResidual(16, 24, 4, 2, 5, se=True), InvertedResidual(24, 24, 4, 1, se=True),
                                 width=24),
    "convnext": lambda: _net(ConvNeXtBlock(16), ConvNeXtBlock(16), width=16),
}


def _export(name: str, folder):
    torch.manual_seed(0)
    model = BLOCKS[name]().eval()
    for module in model.modules():  # BatchNorm statistics that are not the identity
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.1, 0.1)
            module.running_var.uniform_(0.5, 1.5)
    path = folder / f"{name}.onnx"
    torch.onnx.export(model, (torch.randn(1, 3, 16, 16),), str(path), dynamo=False, input_names=["image"],
                      output_names=["logits"], opset_version=17)
    return path


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_every_kernel_of_a_cnn_block_is_scheduled(name, tmp_path):
    result = api.compile(str(_export(name, tmp_path)), target="x86", output=tmp_path / "art", isolate=False)
    schedules = result.manifest.compile.schedules
    assert schedules["default"] and not schedules["unscheduled"], (schedules["unscheduled"], result.notes)
    assert result.check.passed

