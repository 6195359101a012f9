"""A text classifier over sentences of different lengths, as the tutorials write one: a
Dataset subclass, a DataLoader whose collate_fn pads with nn.utils.rnn.pad_sequence, an
Embedding with padding_idx, a TransformerEncoder (batch_first) told which positions are padding,
a masked mean over the sentence, CrossEntropyLoss with label smoothing, Adam with a LambdaLR
warmup and gradient accumulation over two batches; accuracy under torch.no_grad at the end."""
import math

import numpy as np
import torch
import torch.nn as nn
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Dataset

PAD = 0


class Sentences(Dataset):
    def __init__(self, n, vocab, n_classes, seed):
        rng = np.random.default_rng(seed)
        self.items = []
        for _ in range(n):
            label = int(rng.integers(0, n_classes))
            length = int(rng.integers(3, 9))
            # the label shows in the words: token ids of one class share a residue
            words = rng.integers(1, vocab // n_classes, length) * n_classes + label
            self.items.append((torch.tensor(np.minimum(words, vocab - 1)), label))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def collate(batch):
    words, labels = zip(*batch)
    return pad_sequence(list(words), batch_first=True, padding_value=PAD), torch.tensor(labels)


class Classifier(nn.Module):
    def __init__(self, vocab, d_model, n_head, n_layers, n_classes):
        super().__init__()
        self.embedding = nn.Embedding(vocab, d_model, padding_idx=PAD)
        layer = nn.TransformerEncoderLayer(d_model, n_head, dim_feedforward=2 * d_model, dropout=0.0,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, n_classes)

    def forward(self, words):
        padding = words == PAD
        h = self.encoder(self.embedding(words), src_key_padding_mask=padding)
        keep = (~padding).unsqueeze(-1).float()
        return self.head((h * keep).sum(1) / keep.sum(1))


def init_from_numpy(model, seed):
    """The same starting weights under any library: numpy draws them, not the library's generator."""
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            bound = 1 / math.sqrt(p[0].numel()) if p.dim() > 1 else 0.1
            base = 1.0 if p.dim() == 1 and "norm" in name and name.endswith("weight") else 0.0
            p.copy_(torch.from_numpy((base + rng.uniform(-bound, bound, p.shape)).astype(np.float32)))


def main(steps=4, accumulate=2):
    torch.manual_seed(0)
    vocab, n_classes = 40, 4
    train_loader = DataLoader(Sentences(8 * steps * accumulate, vocab, n_classes, 0), batch_size=8,
                              shuffle=False, collate_fn=collate)
    test_loader = DataLoader(Sentences(16, vocab, n_classes, 1), batch_size=8, collate_fn=collate)
    model = Classifier(vocab, 16, 2, 2, n_classes)
    init_from_numpy(model, 0)
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 2))

    model.train()
    losses, running = [], 0.0
    for i, (words, labels) in enumerate(train_loader):
        loss = criterion(model(words), labels) / accumulate
        loss.backward()
        running += loss.item()
        if (i + 1) % accumulate == 0:
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            losses.append(running)
            running = 0.0

    model.eval()
    correct = total = 0
    with torch.no_grad():
        for words, labels in test_loader:
            correct += (model(words).argmax(-1) == labels).sum().item()
            total += labels.numel()
    return losses + [correct / total]


if __name__ == "__main__":
    print(main())
