"""tv_resnet.py: torchvision's ResNet (v1.5) written out for the tests (torchvision is not installed):
the reference train_resnet.sh compares mge's resnet variants with. Names, shapes, init and
forward follow torchvision.models.resnet; in_ch, width and cifar_stem are the spec's data.image
channels, model.width and model.stem: cifar."""
import torch, torch.nn as nn
class BasicBlock(nn.Module):
    expansion = 1
    def __init__(s, inp, planes, stride=1, down=None):
        super().__init__()
        s.conv1 = nn.Conv2d(inp, planes, 3, stride, 1, bias=False); s.bn1 = nn.BatchNorm2d(planes)
        s.relu = nn.ReLU(inplace=True)
        s.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False); s.bn2 = nn.BatchNorm2d(planes)
        s.downsample = down
    def forward(s, x):
        i = x if s.downsample is None else s.downsample(x)
        o = s.relu(s.bn1(s.conv1(x)))
        return s.relu(s.bn2(s.conv2(o)) + i)
class Bottleneck(nn.Module):
    expansion = 4
    def __init__(s, inp, planes, stride=1, down=None):
        super().__init__()
        s.conv1 = nn.Conv2d(inp, planes, 1, bias=False); s.bn1 = nn.BatchNorm2d(planes)
        s.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False); s.bn2 = nn.BatchNorm2d(planes)
        s.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False); s.bn3 = nn.BatchNorm2d(planes * 4)
        s.relu = nn.ReLU(inplace=True); s.downsample = down
    def forward(s, x):
        i = x if s.downsample is None else s.downsample(x)
        o = s.relu(s.bn1(s.conv1(x))); o = s.relu(s.bn2(s.conv2(o))); o = s.bn3(s.conv3(o))
        return s.relu(o + i)
class ResNet(nn.Module):
    def __init__(s, block, layers, num_classes=1000, in_ch=3, width=64, cifar_stem=False):
        super().__init__()
        s.inplanes = width
        if cifar_stem:
            s.conv1 = nn.Conv2d(in_ch, width, 3, 1, 1, bias=False); s.maxpool = nn.Identity()
        else:
            s.conv1 = nn.Conv2d(in_ch, width, 7, 2, 3, bias=False); s.maxpool = nn.MaxPool2d(3, 2, 1)
        s.bn1 = nn.BatchNorm2d(width); s.relu = nn.ReLU(inplace=True)
        s.layer1 = s._make(block, width, layers[0])
        s.layer2 = s._make(block, width * 2, layers[1], 2)
        s.layer3 = s._make(block, width * 4, layers[2], 2)
        s.layer4 = s._make(block, width * 8, layers[3], 2)
        s.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        s.fc = nn.Linear(width * 8 * block.expansion, num_classes)
        for m in s.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1); nn.init.constant_(m.bias, 0)
    def _make(s, block, planes, n, stride=1):
        down = None
        if stride != 1 or s.inplanes != planes * block.expansion:
            down = nn.Sequential(nn.Conv2d(s.inplanes, planes * block.expansion, 1, stride, bias=False),
                                 nn.BatchNorm2d(planes * block.expansion))
        layers = [block(s.inplanes, planes, stride, down)]
        s.inplanes = planes * block.expansion
        layers += [block(s.inplanes, planes) for _ in range(1, n)]
        return nn.Sequential(*layers)
    def forward(s, x):
        x = s.maxpool(s.relu(s.bn1(s.conv1(x))))
        x = s.layer4(s.layer3(s.layer2(s.layer1(x))))
        return s.fc(torch.flatten(s.avgpool(x), 1))
VARIANTS = {"resnet18": (BasicBlock, [2, 2, 2, 2]), "resnet34": (BasicBlock, [3, 4, 6, 3]),
            "resnet50": (Bottleneck, [3, 4, 6, 3]), "resnet101": (Bottleneck, [3, 4, 23, 3]),
            "resnet152": (Bottleneck, [3, 8, 36, 3])}
def resnet(variant, **kw):
    b, l = VARIANTS[variant]
    return ResNet(b, l, **kw)

if __name__ == "__main__":  # torchvision's published parameter counts (1000 classes)
    for v in VARIANTS:
        print(v, sum(p.numel() for p in resnet(v).parameters()))
