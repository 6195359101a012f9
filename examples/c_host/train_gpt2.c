/* GPT-2 training in plain C on libinfinitrain's ABI alone, as llm.c's train_gpt2.c trains it
 * with its own loops: an llm.c checkpoint and token shard in, AdamW steps, llm.c's step line
 * out. Every kernel (embedding, LayerNorm, the linears, attention, GELU, the fused
 * cross-entropy over the padded vocabulary, AdamW) is the library's, so the losses are the
 * Python engine's (python -m infinitrain.examples.gpt2 with the same checkpoint, shard and
 * AdamW settings). Build and run:
 *
 *   cc -O2 examples/c_host/train_gpt2.c $(python -m infinitrain.config --cflags --libs) -lm \
 *      -o train_gpt2
 *   ./train_gpt2 -e gpt2_124M.bin -i train.bin -b 4 -t 64 -n 10 -l 1e-4
 *
 * -d cuda runs the same code on GPU 0 (the ABI dispatches every call by the device its
 * pointers live on; the host only copies the checkpoint in, each batch's tokens in and each
 * step's loss out). That needs a library built with CUDA (INFINITRAIN_CUDA=ON); it has not been
 * run here, on a machine without a GPU.
 *
 * AdamW as the Python example's defaults: betas (0.9, 0.95), eps 1e-8, decoupled weight decay
 * (-w, default 0) on the matrices and embeddings only, no gradient clipping (its default). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "infinitrain.h"

/* Every ABI call's status is checked: on failure its message is printed and the calling
 * function returns 1 (the library itself never aborts or prints). */
#define TRY(call)                                                                            \
    do {                                                                                     \
        it_status st_ = (call);                                                              \
        if (st_ != IT_OK) {                                                                  \
            fprintf(stderr, "train_gpt2: %s failed: %s (%s)\n", #call, it_last_error(),      \
                    it_status_name(st_));                                                    \
            return 1;                                                                        \
        }                                                                                    \
    } while (0)
#define FAIL(...) (fprintf(stderr, "train_gpt2: " __VA_ARGS__), fputc('\n', stderr), 1)

static const it_dtype F32 = IT_FLOAT32;

/* ---- the model ------------------------------------------------------------------------ */
typedef struct {
    int64_t max_seq_len, vocab_size, padded_vocab_size, num_layers, num_heads, channels;
} GPT2Config;

/* The parameters in llm.c's checkpoint order; each per-layer tensor holds all L layers. */
#define NUM_PARAMETER_TENSORS 16
typedef struct {
    float *wte, *wpe, *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w, *ln2b, *fcw, *fcb,
        *fcprojw, *fcprojb, *lnfw, *lnfb;
} ParameterTensors;

static void parameter_sizes(const GPT2Config *c, int64_t sizes[NUM_PARAMETER_TENSORS]) {
    int64_t Vp = c->padded_vocab_size, C = c->channels, L = c->num_layers;
    int64_t s[NUM_PARAMETER_TENSORS] = {Vp * C, c->max_seq_len * C, L * C, L * C,
                                        L * 3 * C * C, L * 3 * C, L * C * C, L * C, L * C, L * C,
                                        L * 4 * C * C, L * 4 * C, L * C * 4 * C, L * C, C, C};
    memcpy(sizes, s, sizeof(s));
}

/* Which tensors AdamW decays: the 2-D ones (embeddings and linear weights), as the Python
 * example's decay_groups does. */
static const int DECAYED[NUM_PARAMETER_TENSORS] = {1, 1, 0, 0, 1, 0, 1, 0, 0, 0, 1, 0, 1, 0, 0, 0};

static void point_parameters(ParameterTensors *p, float *base, const int64_t *sizes) {
    float **ptrs[NUM_PARAMETER_TENSORS] = {
        &p->wte, &p->wpe, &p->ln1w, &p->ln1b, &p->qkvw, &p->qkvb, &p->attprojw, &p->attprojb,
        &p->ln2w, &p->ln2b, &p->fcw, &p->fcb, &p->fcprojw, &p->fcprojb, &p->lnfw, &p->lnfb};
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) *ptrs[i] = base, base += sizes[i];
}

/* What the forward pass keeps for the backward pass (per-layer ones hold all L layers), and
 * the backward pass's scratch. */
typedef struct {
    float *encoded, *ln1, *ln1_mean, *ln1_rstd, *qkvh, *atty, *att_lse, *attmerged, *residual2,
        *ln2, *ln2_mean, *ln2_rstd, *fch, *fch_gelu, *residual3, *lnf, *lnf_mean, *lnf_rstd,
        *logits, *losses, *lse, *dlosses, *loss_sum;
    float *scratch_3c, *scratch_c, *dresidual, *dx, *dln, *dbig, *dbig2, *dqkv, *dqkvh, *datty;
    int32_t *inputs, *targets;
} Activations;

typedef struct {
    GPT2Config config;
    it_device device;
    int64_t num_parameters, sizes[NUM_PARAMETER_TENSORS];
    ParameterTensors params, grads;
    float *m, *v;  /* AdamW's moments, laid out as the parameters */
    it_storage *params_mem, *grads_mem, *m_mem, *v_mem, *acts_mem;
    Activations acts;
    int64_t B, T;
    float mean_loss;
} GPT2;

/* ---- llm.c files ---------------------------------------------------------------------- */
static int read_header(FILE *f, const char *path, int32_t header[256], long *size) {
    if (fseek(f, 0, SEEK_END) != 0 || (*size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0)
        return FAIL("%s: cannot find its size", path);
    if (*size < 1024) return FAIL("%s: %ld bytes is shorter than the 1024-byte llm.c header", path, *size);
    if (fread(header, sizeof(int32_t), 256, f) != 256) return FAIL("%s: cannot read the header", path);
    return 0;
}

/* An llm.c GPT-2 checkpoint: 256 int32 (magic 20240326, version 3 = float32 or 5 = bfloat16,
 * block size, vocabulary, layers, heads, channels, padded vocabulary), then the 16 tensors. */
static int gpt2_build_from_checkpoint(GPT2 *model, const char *path, it_device device) {
    FILE *f = fopen(path, "rb");
    if (!f) return FAIL("cannot open checkpoint %s: %s", path, strerror(errno));
    int32_t h[256];
    long size;
    if (read_header(f, path, h, &size)) return fclose(f), 1;
    if (h[0] != 20240326)
        return fclose(f), FAIL("%s: magic number %d is not an llm.c GPT-2 checkpoint's (20240326)", path, h[0]);
    if (h[1] != 3 && h[1] != 5)
        return fclose(f), FAIL("%s: checkpoint version %d is not supported (3 = float32, 5 = bfloat16)", path, h[1]);
    GPT2Config *c = &model->config;
    *c = (GPT2Config){h[2], h[3], h[7], h[4], h[5], h[6]};
    if (c->max_seq_len < 1 || c->vocab_size < 1 || c->num_layers < 1 || c->num_heads < 1 ||
        c->channels < 1 || c->channels % c->num_heads)
        return fclose(f), FAIL("%s: header sizes (block size %d, vocabulary %d, layers %d, heads %d, "
                               "channels %d) must be positive, channels a multiple of heads",
                               path, h[2], h[3], h[4], h[5], h[6]);
    double numel = (double)c->padded_vocab_size * c->channels + (double)c->max_seq_len * c->channels +
                   (double)c->num_layers * (12.0 * c->channels * c->channels + 13.0 * c->channels);
    if (numel > 1e15)  /* (before any size is multiplied out in int64) */
        return fclose(f), FAIL("%s: header sizes give %.3g parameters: not a checkpoint", path, numel);
    if (c->padded_vocab_size != (c->vocab_size + 127) / 128 * 128)
        return fclose(f), FAIL("%s: padded vocabulary %d is not %d rounded up to 128", path, h[7], h[3]);
    parameter_sizes(c, model->sizes);
    model->num_parameters = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) model->num_parameters += model->sizes[i];
    int64_t n = model->num_parameters, itemsize = h[1] == 3 ? 4 : 2;
    if (size != 1024 + n * itemsize)
        return fclose(f), FAIL("%s: %ld bytes, but a %d-layer, %d-wide model in version %d needs %lld (%s)",
                               path, size, h[4], h[6], h[1], (long long)(1024 + n * itemsize),
                               size < 1024 + n * itemsize ? "truncated" : "trailing data");
    model->device = device;
    it_status st = it_storage_new(device, (size_t)n * sizeof(float), &model->params_mem);
    if (st != IT_OK)
        return fclose(f), FAIL("it_storage_new for the parameters failed: %s (%s)", it_last_error(), it_status_name(st));
    float *host = malloc((size_t)n * sizeof(float));
    if (!host) return fclose(f), FAIL("out of host memory for %lld parameters", (long long)n);
    size_t got = fread(host, (size_t)itemsize, (size_t)n, f);  /* bfloat16 fills the first half */
    fclose(f);
    if (got != (size_t)n) return free(host), FAIL("%s: read %zu of %lld parameters", path, got, (long long)n);
    it_device cpu = {IT_CPU, 0};
    if (itemsize == 2) {  /* bfloat16 (version 5): widened to float32 by the library's cast */
        uint16_t *bf = malloc((size_t)n * 2);
        if (!bf) return free(host), FAIL("out of host memory for %lld parameters", (long long)n);
        memcpy(bf, host, (size_t)n * 2);
        st = it_cast(cpu, host, F32, bf, IT_BFLOAT16, n);
        free(bf);
        if (st != IT_OK) return free(host), FAIL("it_cast: %s", it_last_error());
    }
    st = it_memcpy(device, it_storage_data(model->params_mem), cpu, host, (size_t)n * sizeof(float));
    free(host);
    if (st != IT_OK) return FAIL("it_memcpy of the parameters failed: %s (%s)", it_last_error(), it_status_name(st));
    point_parameters(&model->params, it_storage_data(model->params_mem), model->sizes);
    return 0;
}

/* An llm.c token shard: 256 int32 (magic 20240520 version 1: uint16 GPT-2 tokens; 20240801
 * version 7 or 2: uint32), then the tokens. Batches are read as llm.c's DataLoader reads them:
 * B*T+1 tokens from the current position (inputs all but the last, targets all but the first),
 * the position advancing by B*T and going back to the start when the next window would not fit. */
typedef struct {
    FILE *file;
    const char *path;
    int64_t num_tokens, token_bytes, position, B, T;
    void *window;
} DataLoader;

static int dataloader_init(DataLoader *d, const char *path, int64_t B, int64_t T) {
    *d = (DataLoader){.path = path, .B = B, .T = T};
    if (!(d->file = fopen(path, "rb"))) return FAIL("cannot open token shard %s: %s", path, strerror(errno));
    int32_t h[256];
    long size;
    if (read_header(d->file, path, h, &size)) return 1;
    if (h[0] == 20240520 && h[1] == 1) d->token_bytes = 2;
    else if (h[0] == 20240801 && (h[1] == 7 || h[1] == 2)) d->token_bytes = 4;
    else return FAIL("%s: magic %d version %d is not an llm.c token shard's (20240520 version 1, or "
                     "20240801 version 7); is this the right file?", path, h[0], h[1]);
    d->num_tokens = h[2];
    if (d->num_tokens <= 0) return FAIL("%s: the header says it holds %d tokens", path, h[2]);
    if (size != 1024 + d->num_tokens * d->token_bytes)
        return FAIL("%s: the header says %d tokens (%lld bytes) but the file has %ld bytes", path, h[2],
                    (long long)(1024 + d->num_tokens * d->token_bytes), size);
    if (d->num_tokens < B * T + 1)
        return FAIL("%s: %lld tokens are fewer than one step needs (%lld = batch %lld x sequence %lld + 1); "
                    "use a smaller batch", path, (long long)d->num_tokens, (long long)(B * T + 1),
                    (long long)B, (long long)T);
    if (!(d->window = malloc((size_t)(B * T + 1) * (size_t)d->token_bytes)))
        return FAIL("out of host memory for a batch");
    return 0;
}

/* Reads the next batch into host inputs/targets [B*T], checking each id against the vocabulary. */
static int dataloader_next_batch(DataLoader *d, int32_t *inputs, int32_t *targets, int64_t vocab) {
    int64_t n = d->B * d->T + 1;
    if (fseek(d->file, 1024 + (long)(d->position * d->token_bytes), SEEK_SET) != 0 ||
        fread(d->window, (size_t)d->token_bytes, (size_t)n, d->file) != (size_t)n)
        return FAIL("%s: cannot read %lld tokens at token %lld", d->path, (long long)n, (long long)d->position);
    for (int64_t i = 0; i < n; i++) {
        uint32_t t = d->token_bytes == 2 ? ((uint16_t *)d->window)[i] : ((uint32_t *)d->window)[i];
        if (t >= (uint64_t)vocab)
            return FAIL("%s: token id %u at position %lld is not below the vocabulary size %lld", d->path,
                        t, (long long)(d->position + i), (long long)vocab);
        if (i < n - 1) inputs[i] = (int32_t)t;
        if (i > 0) targets[i - 1] = (int32_t)t;
    }
    d->position += d->B * d->T;
    if (d->position + n > d->num_tokens) d->position = 0;
    return 0;
}

/* ---- building blocks ------------------------------------------------------------------ */
/* out [N, OC] = inp [N, C] @ weight[OC, C]^T + bias: the bias preloaded into out and the
 * product accumulated onto it, one sgemm (as the Python engine's Linear does). */
static int linear_forward(it_device dev, float *out, const float *inp, const float *weight,
                          const float *bias, int64_t N, int64_t C, int64_t OC) {
    const int64_t shape[2] = {N, OC}, out_strides[2] = {OC, 1}, bias_strides[2] = {0, 1};
    if (bias) TRY(it_copy_strided(dev, F32, out, out_strides, bias, bias_strides, shape, 2));
    TRY(it_matmul(dev, F32, out, inp, weight, 1, N, OC, C, 0, 1, 1.0f, bias ? 1.0f : 0.0f, 0, 0, 0));
    return 0;
}

/* dinp = dout @ weight, dweight = dout^T @ inp, dbias = the column sums of dout (all written). */
static int linear_backward(it_device dev, float *dinp, float *dweight, float *dbias, const float *dout,
                           const float *inp, const float *weight, int64_t N, int64_t C, int64_t OC) {
    TRY(it_matmul(dev, F32, dinp, dout, weight, 1, N, C, OC, 0, 0, 1.0f, 0.0f, 0, 0, 0));
    TRY(it_matmul(dev, F32, dweight, dout, inp, 1, OC, C, N, 1, 0, 1.0f, 0.0f, 0, 0, 0));
    if (dbias) TRY(it_reduce(dev, IT_SUM, F32, dbias, dout, 1, N, OC));
    return 0;
}

static int add(it_device dev, float *out, const float *a, const float *b, int64_t n) {
    const int64_t unit[1] = {1};
    TRY(it_binary(dev, IT_ADD, F32, out, a, unit, b, unit, &n, 1));
    return 0;
}

/* [B, T, 3C] <-> q, k, v each [B, H, T, D]: to_heads copies qkv's three parts out, from_heads
 * (the backward pass) copies them back in. */
static int heads_copy(it_device dev, float *qkv, float *qkvh, int64_t B, int64_t T, int64_t H,
                      int64_t D, int to_heads) {
    const int64_t C = H * D, shape[4] = {B, H, T, D};
    const int64_t packed[4] = {T * 3 * C, D, 3 * C, 1}, heads[4] = {H * T * D, T * D, D, 1};
    for (int part = 0; part < 3; part++) {
        float *p = qkv + part * C, *hp = qkvh + part * B * T * C;
        if (to_heads) TRY(it_copy_strided(dev, F32, hp, heads, p, packed, shape, 4));
        else TRY(it_copy_strided(dev, F32, p, packed, hp, heads, shape, 4));
    }
    return 0;
}

/* [B, H, T, D] <-> [B, T, C] (attention's output merged back into channels, and its gradient). */
static int merge_copy(it_device dev, float *btc, float *bhtd, int64_t B, int64_t T, int64_t H,
                      int64_t D, int merge) {
    const int64_t shape[4] = {B, H, T, D}, heads[4] = {H * T * D, T * D, D, 1};
    const int64_t merged[4] = {T * H * D, D, H * D, 1};
    if (merge) TRY(it_copy_strided(dev, F32, btc, merged, bhtd, heads, shape, 4));
    else TRY(it_copy_strided(dev, F32, bhtd, heads, btc, merged, shape, 4));
    return 0;
}

/* ---- allocation ----------------------------------------------------------------------- */
static int gpt2_allocate(GPT2 *model, int64_t B, int64_t T) {
    const GPT2Config *c = &model->config;
    int64_t L = c->num_layers, C = c->channels, H = c->num_heads, Vp = c->padded_vocab_size;
    int64_t BT = B * T, BTC = BT * C, n = model->num_parameters;
    it_device dev = model->device;
    model->B = B, model->T = T;
    TRY(it_storage_new(dev, (size_t)n * sizeof(float), &model->grads_mem));
    TRY(it_storage_new(dev, (size_t)n * sizeof(float), &model->m_mem));
    TRY(it_storage_new(dev, (size_t)n * sizeof(float), &model->v_mem));
    point_parameters(&model->grads, it_storage_data(model->grads_mem), model->sizes);
    model->m = it_storage_data(model->m_mem), model->v = it_storage_data(model->v_mem);
    TRY(it_fill(dev, F32, model->m, 0.0, n));
    TRY(it_fill(dev, F32, model->v, 0.0, n));
    /* rows of wpe past T never get a gradient: zero once (every other gradient is written whole
     * by each backward pass, so there is no zero_grad) */
    TRY(it_fill(dev, F32, model->grads.wpe, 0.0, model->sizes[1]));

    Activations *a = &model->acts;
    float **ptrs[] = {&a->encoded, &a->ln1, &a->ln1_mean, &a->ln1_rstd, &a->qkvh, &a->atty,
                      &a->att_lse, &a->attmerged, &a->residual2, &a->ln2, &a->ln2_mean,
                      &a->ln2_rstd, &a->fch, &a->fch_gelu, &a->residual3, &a->lnf, &a->lnf_mean,
                      &a->lnf_rstd, &a->logits, &a->losses, &a->lse, &a->dlosses, &a->loss_sum,
                      &a->scratch_3c, &a->scratch_c, &a->dresidual, &a->dx, &a->dln, &a->dbig,
                      &a->dbig2, &a->dqkv, &a->dqkvh, &a->datty, (float **)&a->inputs,
                      (float **)&a->targets};
    int64_t sizes[] = {BTC, L * BTC, L * BT, L * BT, L * 3 * BTC, L * BTC, L * B * H * T,
                       L * BTC, L * BTC, L * BTC, L * BT, L * BT, L * 4 * BTC, L * 4 * BTC,
                       L * BTC, BTC, BT, BT, BT * Vp, BT, BT, BT, 1,
                       3 * BTC, BTC, BTC, BTC, BTC, 4 * BTC, 4 * BTC, 3 * BTC, 3 * BTC, BTC, BT, BT};
    int count = (int)(sizeof(sizes) / sizeof(sizes[0]));
    int64_t total = 0;
    for (int i = 0; i < count; i++) total += (sizes[i] + 15) / 16 * 16;  /* 64-byte aligned */
    TRY(it_storage_new(dev, (size_t)total * sizeof(float), &model->acts_mem));
    float *p = it_storage_data(model->acts_mem);
    for (int i = 0; i < count; i++) *ptrs[i] = p, p += (sizes[i] + 15) / 16 * 16;
    return 0;
}

/* ---- forward, backward, update -------------------------------------------------------- */
/* The inputs and targets are already on the device; leaves the mean loss in model->mean_loss. */
static int gpt2_forward(GPT2 *model) {
    const GPT2Config *c = &model->config;
    int64_t B = model->B, T = model->T, L = c->num_layers, C = c->channels, H = c->num_heads;
    int64_t D = C / H, V = c->vocab_size, Vp = c->padded_vocab_size, BT = B * T, BTC = BT * C;
    it_device dev = model->device;
    ParameterTensors p = model->params;
    Activations *a = &model->acts;
    float scale = (float)(1.0 / sqrt((double)D));

    /* token embeddings plus the positions' (wpe's first T rows, broadcast over the batch) */
    TRY(it_embedding_forward(dev, F32, a->encoded, a->inputs, IT_INT32, p.wte, BT, Vp, C));
    const int64_t shape[3] = {B, T, C}, seq[3] = {T * C, C, 1}, pos[3] = {0, C, 1};
    TRY(it_binary(dev, IT_ADD, F32, a->encoded, a->encoded, seq, p.wpe, pos, shape, 3));

    for (int64_t l = 0; l < L; l++) {
        float *residual = l == 0 ? a->encoded : a->residual3 + (l - 1) * BTC;
        float *ln1 = a->ln1 + l * BTC, *qkvh = a->qkvh + l * 3 * BTC, *atty = a->atty + l * BTC;
        float *att_lse = a->att_lse + l * B * H * T, *attmerged = a->attmerged + l * BTC;
        float *residual2 = a->residual2 + l * BTC, *ln2 = a->ln2 + l * BTC;
        float *fch = a->fch + l * 4 * BTC, *fch_gelu = a->fch_gelu + l * 4 * BTC;
        /* attention: LayerNorm, qkv, causal attention over the heads, the output projection */
        TRY(it_layernorm_forward(dev, F32, ln1, a->ln1_mean + l * BT, a->ln1_rstd + l * BT, residual,
                                 p.ln1w + l * C, p.ln1b + l * C, BT, C, 1e-5f));
        if (linear_forward(dev, a->scratch_3c, ln1, p.qkvw + l * 3 * C * C, p.qkvb + l * 3 * C, BT, C, 3 * C))
            return 1;
        if (heads_copy(dev, a->scratch_3c, qkvh, B, T, H, D, 1)) return 1;
        TRY(it_attention_forward(dev, F32, atty, att_lse, qkvh, qkvh + BTC, qkvh + 2 * BTC, B, H, H, T,
                                 T, D, scale, 1, NULL));
        if (merge_copy(dev, attmerged, atty, B, T, H, D, 1)) return 1;
        if (linear_forward(dev, a->scratch_c, attmerged, p.attprojw + l * C * C, p.attprojb + l * C, BT, C, C))
            return 1;
        if (add(dev, residual2, residual, a->scratch_c, BTC)) return 1;
        /* MLP: LayerNorm, fc, GELU (tanh), the projection back */
        TRY(it_layernorm_forward(dev, F32, ln2, a->ln2_mean + l * BT, a->ln2_rstd + l * BT, residual2,
                                 p.ln2w + l * C, p.ln2b + l * C, BT, C, 1e-5f));
        if (linear_forward(dev, fch, ln2, p.fcw + l * 4 * C * C, p.fcb + l * 4 * C, BT, C, 4 * C)) return 1;
        TRY(it_unary(dev, IT_GELU_TANH, F32, fch_gelu, fch, BT * 4 * C));
        if (linear_forward(dev, a->scratch_c, fch_gelu, p.fcprojw + l * C * 4 * C, p.fcprojb + l * C, BT,
                           4 * C, C))
            return 1;
        if (add(dev, a->residual3 + l * BTC, residual2, a->scratch_c, BTC)) return 1;
    }
    TRY(it_layernorm_forward(dev, F32, a->lnf, a->lnf_mean, a->lnf_rstd, a->residual3 + (L - 1) * BTC,
                             p.lnfw, p.lnfb, BT, C, 1e-5f));
    /* the LM head is the token embedding (tied), over the padded vocabulary; the loss reads
     * only the first V columns */
    if (linear_forward(dev, a->logits, a->lnf, p.wte, NULL, BT, C, Vp)) return 1;
    TRY(it_cross_entropy_forward(dev, F32, a->losses, a->lse, a->logits, a->targets, IT_INT32, BT, V, Vp,
                                 -100));
    TRY(it_reduce(dev, IT_SUM, F32, a->loss_sum, a->losses, 1, BT, 1));
    float loss_sum;
    TRY(it_memcpy((it_device){IT_CPU, 0}, &loss_sum, dev, a->loss_sum, sizeof(float)));
    model->mean_loss = loss_sum / (float)BT;
    return 0;
}

/* Gradients of the mean loss, every one written whole (the tied wte's: the head's product
 * first, then the embedding's rows added). */
static int gpt2_backward(GPT2 *model) {
    const GPT2Config *c = &model->config;
    int64_t B = model->B, T = model->T, L = c->num_layers, C = c->channels, H = c->num_heads;
    int64_t D = C / H, V = c->vocab_size, Vp = c->padded_vocab_size, BT = B * T, BTC = BT * C;
    it_device dev = model->device;
    ParameterTensors p = model->params, g = model->grads;
    Activations *a = &model->acts;
    float scale = (float)(1.0 / sqrt((double)D));

    TRY(it_fill(dev, F32, a->dlosses, 1.0 / (double)BT, BT));
    /* dlogits are written over the logits, as llm.c does */
    TRY(it_cross_entropy_backward(dev, F32, a->logits, a->logits, a->lse, a->targets, IT_INT32, a->dlosses,
                                  BT, V, Vp, -100));
    if (linear_backward(dev, a->dln, g.wte, NULL, a->logits, a->lnf, p.wte, BT, C, Vp)) return 1;
    TRY(it_layernorm_backward(dev, F32, a->dresidual, g.lnfw, g.lnfb, a->dln, a->residual3 + (L - 1) * BTC,
                              p.lnfw, a->lnf_mean, a->lnf_rstd, BT, C));

    for (int64_t l = L - 1; l >= 0; l--) {  /* a->dresidual: the gradient of layer l's output */
        float *residual = l == 0 ? a->encoded : a->residual3 + (l - 1) * BTC;
        float *ln1 = a->ln1 + l * BTC, *qkvh = a->qkvh + l * 3 * BTC, *atty = a->atty + l * BTC;
        float *residual2 = a->residual2 + l * BTC, *ln2 = a->ln2 + l * BTC;
        float *fch = a->fch + l * 4 * BTC, *fch_gelu = a->fch_gelu + l * 4 * BTC;
        /* MLP: the residual passes dresidual through, the branch adds its input's gradient */
        if (linear_backward(dev, a->dbig, g.fcprojw + l * C * 4 * C, g.fcprojb + l * C, a->dresidual, fch_gelu,
                            p.fcprojw + l * C * 4 * C, BT, 4 * C, C))
            return 1;
        TRY(it_unary_backward(dev, IT_GELU_TANH, F32, a->dbig2, a->dbig, fch, BT * 4 * C));
        if (linear_backward(dev, a->dln, g.fcw + l * 4 * C * C, g.fcb + l * 4 * C, a->dbig2, ln2,
                            p.fcw + l * 4 * C * C, BT, C, 4 * C))
            return 1;
        TRY(it_layernorm_backward(dev, F32, a->dx, g.ln2w + l * C, g.ln2b + l * C, a->dln, residual2,
                                  p.ln2w + l * C, a->ln2_mean + l * BT, a->ln2_rstd + l * BT, BT, C));
        if (add(dev, a->dresidual, a->dresidual, a->dx, BTC)) return 1;
        /* attention */
        if (linear_backward(dev, a->scratch_c, g.attprojw + l * C * C, g.attprojb + l * C, a->dresidual,
                            a->attmerged + l * BTC, p.attprojw + l * C * C, BT, C, C))
            return 1;
        if (merge_copy(dev, a->scratch_c, a->datty, B, T, H, D, 0)) return 1;
        TRY(it_attention_backward(dev, F32, a->dqkvh, a->dqkvh + BTC, a->dqkvh + 2 * BTC, a->datty, qkvh,
                                  qkvh + BTC, qkvh + 2 * BTC, atty, a->att_lse + l * B * H * T, B, H, H, T, T,
                                  D, scale, 1, NULL));
        if (heads_copy(dev, a->dqkv, a->dqkvh, B, T, H, D, 0)) return 1;
        if (linear_backward(dev, a->dln, g.qkvw + l * 3 * C * C, g.qkvb + l * 3 * C, a->dqkv, ln1,
                            p.qkvw + l * 3 * C * C, BT, C, 3 * C))
            return 1;
        TRY(it_layernorm_backward(dev, F32, a->dx, g.ln1w + l * C, g.ln1b + l * C, a->dln, residual,
                                  p.ln1w + l * C, a->ln1_mean + l * BT, a->ln1_rstd + l * BT, BT, C));
        if (add(dev, a->dresidual, a->dresidual, a->dx, BTC)) return 1;
    }
    /* the embeddings: token rows scatter-added onto the head's gradient, positions summed
     * over the batch */
    TRY(it_embedding_backward(dev, F32, g.wte, a->dresidual, a->inputs, IT_INT32, BT, Vp, C));
    TRY(it_reduce(dev, IT_SUM, F32, g.wpe, a->dresidual, 1, B, T * C));
    return 0;
}

static int gpt2_update(GPT2 *model, float lr, float beta1, float beta2, float eps, float weight_decay,
                       int64_t step) {
    int64_t offset = 0;
    float *params = it_storage_data(model->params_mem), *grads = it_storage_data(model->grads_mem);
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        int64_t n = model->sizes[i];
        TRY(it_adamw_step(model->device, F32, params + offset, grads + offset, model->m + offset,
                          model->v + offset, n, lr, beta1, beta2, eps, DECAYED[i] ? weight_decay : 0.0f, step));
        offset += n;
    }
    return 0;
}

static void gpt2_free(GPT2 *model) {
    it_storage *all[] = {model->params_mem, model->grads_mem, model->m_mem, model->v_mem, model->acts_mem};
    for (int i = 0; i < 5; i++)
        if (all[i] && it_storage_free(all[i]) != IT_OK)
            fprintf(stderr, "train_gpt2: it_storage_free: %s\n", it_last_error());
}

/* ---- the training loop ---------------------------------------------------------------- */
static int upload_batch(GPT2 *model, const int32_t *inputs, const int32_t *targets) {
    const it_device cpu = {IT_CPU, 0};
    size_t bytes = (size_t)(model->B * model->T) * sizeof(int32_t);
    TRY(it_memcpy(model->device, model->acts.inputs, cpu, inputs, bytes));
    TRY(it_memcpy(model->device, model->acts.targets, cpu, targets, bytes));
    return 0;
}

static int synchronize(it_device device) {  /* the step's time includes the device's work */
    TRY(it_device_synchronize(device));
    return 0;
}

static void usage(void) {
    fprintf(stderr,
            "Usage:   ./train_gpt2 [options]\n"
            "Options:\n"
            "  -e <string> llm.c GPT-2 checkpoint (default gpt2_124M.bin)\n"
            "  -i <string> llm.c token shard to train on (default dev/data/tinyshakespeare/tiny_shakespeare_train.bin)\n"
            "  -b <int>    batch size B (default 4)\n"
            "  -t <int>    sequence length T (default 64)\n"
            "  -n <int>    training steps (default 10)\n"
            "  -l <float>  learning rate (default 1e-4)\n"
            "  -w <float>  AdamW weight decay on matrices and embeddings (default 0)\n"
            "  -d <string> device: cpu or cuda (default cpu)\n");
}

static int parse_int(const char *flag, const char *s, long *out) {
    char *end;
    *out = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || *out < 1 || *out > INT32_MAX)
        return FAIL("%s %s: expected a positive integer (at most %d)", flag, s, INT32_MAX);
    return 0;
}

static int parse_float(const char *flag, const char *s, float *out) {
    char *end;
    *out = strtof(s, &end);
    if (*s == '\0' || *end != '\0' || !(*out >= 0.0f) || isinf(*out))
        return FAIL("%s %s: expected a finite number >= 0", flag, s);
    return 0;
}

static int train(int argc, char **argv) {
    const char *checkpoint = "gpt2_124M.bin", *shard = "dev/data/tinyshakespeare/tiny_shakespeare_train.bin";
    const char *device_name = "cpu";
    long B = 4, T = 64, steps = 10;
    float lr = 1e-4f, weight_decay = 0.0f;
    for (int i = 1; i < argc; i += 2) {
        const char *f = argv[i];
        if (f[0] != '-' || strlen(f) != 2) return usage(), FAIL("bad argument %s (flags are -x value)", f);
        if (i + 1 >= argc) return usage(), FAIL("flag %s needs a value", f);
        const char *val = argv[i + 1];
        int bad = 0;
        switch (f[1]) {
            case 'e': checkpoint = val; break;
            case 'i': shard = val; break;
            case 'b': bad = parse_int(f, val, &B); break;
            case 't': bad = parse_int(f, val, &T); break;
            case 'n': bad = parse_int(f, val, &steps); break;
            case 'l': bad = parse_float(f, val, &lr); break;
            case 'w': bad = parse_float(f, val, &weight_decay); break;
            case 'd': device_name = val; break;
            default: return usage(), FAIL("unknown flag %s", f);
        }
        if (bad) return 1;
    }
    it_device device = {IT_CPU, 0};
    if (strcmp(device_name, "cuda") == 0) device.type = IT_CUDA;
    else if (strcmp(device_name, "cpu") != 0) return FAIL("-d %s: expected cpu or cuda", device_name);

    GPT2 model = {0};
    if (gpt2_build_from_checkpoint(&model, checkpoint, device)) return gpt2_free(&model), 1;
    const GPT2Config *c = &model.config;
    printf("%s\n[GPT-2]\nmax_seq_len: %lld\nvocab_size: %lld\npadded_vocab_size: %lld\nnum_layers: %lld\n"
           "num_heads: %lld\nchannels: %lld\nnum_parameters: %lld\n", it_build_info(),
           (long long)c->max_seq_len, (long long)c->vocab_size, (long long)c->padded_vocab_size,
           (long long)c->num_layers, (long long)c->num_heads, (long long)c->channels,
           (long long)model.num_parameters);
    if (T > c->max_seq_len)
        return gpt2_free(&model), FAIL("-t %ld is longer than the checkpoint's block size %lld", T,
                                       (long long)c->max_seq_len);
    DataLoader loader = {0};
    int32_t *inputs = NULL, *targets = NULL;
    int failed = dataloader_init(&loader, shard, B, T);  /* first: B*T is then at most the shard's length */
    if (!failed) {
        inputs = malloc((size_t)(B * T) * sizeof(int32_t)), targets = malloc((size_t)(B * T) * sizeof(int32_t));
        if (!inputs || !targets) failed = FAIL("out of host memory for a batch");
    }
    if (!failed) printf("train dataset num_batches: %lld\n", (long long)(loader.num_tokens / (B * T)));
    if (!failed) failed = gpt2_allocate(&model, B, T);
    for (long step = 0; step < steps && !failed; step++) {
        struct timespec start, end;
        clock_gettime(CLOCK_MONOTONIC, &start);
        failed = dataloader_next_batch(&loader, inputs, targets, c->vocab_size) ||
                 upload_batch(&model, inputs, targets) || gpt2_forward(&model) || gpt2_backward(&model) ||
                 gpt2_update(&model, lr, 0.9f, 0.95f, 1e-8f, weight_decay, step + 1) || synchronize(device);
        if (failed) break;
        clock_gettime(CLOCK_MONOTONIC, &end);
        double ms = (end.tv_sec - start.tv_sec) * 1e3 + (end.tv_nsec - start.tv_nsec) / 1e6;
        printf("step %ld: train loss %f (took %f ms)\n", step, model.mean_loss, ms);
        fflush(stdout);
    }
    if (loader.file) fclose(loader.file);
    free(loader.window), free(inputs), free(targets);
    gpt2_free(&model);
    return failed;
}

int main(int argc, char **argv) { return train(argc, argv) ? 1 : 0; }
