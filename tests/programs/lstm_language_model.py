"""A word-level LSTM language model in the style of PyTorch's word_language_model example:
Embedding, a two-layer batch-first LSTM whose hidden state is carried from batch to batch and
detached (truncated backpropagation through time), a Linear decoder, CrossEntropyLoss over the
flattened logits, clip_grad_norm_, Adam and ReduceLROnPlateau halving the rate when the loss
stalls; perplexity of a held-out batch at the end."""
import math

import numpy as np
import torch
import torch.nn as nn


class RNNModel(nn.Module):
    def __init__(self, ntoken, ninp, nhid, nlayers, dropout=0.0):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout, batch_first=True)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nlayers, self.nhid, self.ntoken = nlayers, nhid, ntoken

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output)
        return decoded.view(-1, self.ntoken), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid),
                weight.new_zeros(self.nlayers, bsz, self.nhid))


def repackage_hidden(h):
    """Hidden states cut from their history, so backpropagation stops at the batch boundary."""
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    data = data.narrow(0, 0, nbatch * bsz)
    return data.view(bsz, -1).contiguous()  # (batch, time): batch_first


def get_batch(source, i, bptt):
    seq_len = min(bptt, source.size(1) - 1 - i)
    return source[:, i:i + seq_len], source[:, i + 1:i + 1 + seq_len].reshape(-1)


def init_from_numpy(model, seed):
    """The same starting weights under any library: numpy draws them, not the library's generator."""
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            bound = 1 / math.sqrt(p[0].numel()) if p.dim() > 1 else 0.1
            p.copy_(torch.from_numpy(rng.uniform(-bound, bound, p.shape).astype(np.float32)))


def main(steps=4):
    torch.manual_seed(1111)
    ntokens, bptt, batch_size = 20, 8, 4
    rng = np.random.default_rng(0)
    corpus = torch.tensor(np.tile(rng.integers(0, ntokens, 37), 5), dtype=torch.long)
    train_data = batchify(corpus[:160], batch_size)
    val_data = batchify(corpus[160:], batch_size)

    model = RNNModel(ntokens, 16, 24, 2)
    init_from_numpy(model, 0)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=0, threshold=0.01)
    losses = []
    model.train()
    hidden = model.init_hidden(batch_size)
    i = 0
    for _ in range(steps):
        if i >= train_data.size(1) - 1:
            i, hidden = 0, model.init_hidden(batch_size)
        data, targets = get_batch(train_data, i, bptt)
        hidden = repackage_hidden(hidden)
        model.zero_grad()
        output, hidden = model(data, hidden)
        loss = criterion(output, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        optimizer.step()
        scheduler.step(loss.item())
        losses.append(loss.item())
        i += bptt

    model.eval()
    with torch.no_grad():
        data, targets = get_batch(val_data, 0, bptt)
        output, _ = model(data, model.init_hidden(batch_size))
        val_loss = criterion(output, targets).item()
    assert math.exp(val_loss) < 2 * ntokens and scheduler.get_last_lr()[0] < 1e-2
    return losses + [val_loss]


if __name__ == "__main__":
    print(main())
