"""``tiny_cnn``: a small CNN with no BatchNorm and no dropout; ``tiny_cnn_dropout``: the same with dropout (p 0.5)
before its classifier.

For smoke tests, slow CPUs, and checks that need a model whose training step does not
depend on how the batch is split over processes (no BN statistics, no random dropout); the dropout variant for the
checks of a step that draws from torch's generator (a resumed run draws as the uninterrupted one).
"""
import torch.nn as nn

from models.registry import register_model


class TinyCNN(nn.Module):
    def __init__(self, num_classes=1000, width=32, dropout=0.0):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 3, stride=2, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(2 * width, 4 * width, 3, stride=2, padding=1), nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1),
        )
        self.dropout = nn.Dropout(dropout) if dropout else None  # tiny_cnn's modules as they were
        self.fc = nn.Linear(4 * width, num_classes)

    def forward(self, x):
        x = self.features(x).flatten(1)
        return self.fc(x if self.dropout is None else self.dropout(x))


@register_model
def tiny_cnn(num_classes=1000, **kwargs):
    return TinyCNN(num_classes=num_classes, **kwargs)


@register_model
def tiny_cnn_dropout(num_classes=1000, **kwargs):
    return TinyCNN(num_classes=num_classes, **dict({"dropout": 0.5}, **kwargs))
