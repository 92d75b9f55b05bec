// Recurrent layers (ONNX LSTM, GRU, RNN) on the GPU: every attribute of the spec but the
// activations without a fused code (the host runs those).  A layer is
//   recurrent_project   once: xp = X @ W^T + folded biases, for every step and direction;
//   recurrent_init      once: the initial states (or zeros) into the plain state buffers;
//   recurrent_steps     the recurrence: one launch for the whole sequence (a work-group per batch
//                       row and direction, a barrier between steps), or, for wide layers, one
//                       launch per step spread over the GPU (ops_recurrent.py chooses).
// Both directions of a bidirectional layer run in the same launch.
//
// Layouts.  Tensors are packed (NC4HW4, ``packed_at``): X [seq, batch, input] (layout 1:
// [batch, seq, input]); Y [seq, dirs, batch, hidden] ([batch, seq, dirs, hidden]); Y_h / Y_c and
// the initial states [dirs, batch, hidden] ([batch, dirs, hidden]); sequence_lens [batch] (in
// the storage float: exact up to 2048 in half).  Scratch buffers are plain: xp [dirs, seq,
// batch, gates * hidden] (the gates in ONNX order: LSTM i, o, f, c; GRU z, r, h), the states h
// [2 (ping-pong), dirs, batch, hidden] and c [dirs, batch, hidden].  The projection weight is
// [dirs, input + 1, gates * hidden] (W^T, then the folded bias row: Wb + Rb, GRU's Rb of the h
// gate excepted); the step weight ``wts`` is, one after another,
//   R^T [dirs, hidden, gates * hidden] (a step's work items read it side by side) |
//   P [dirs, 3 * hidden] (LSTM peepholes i, o, f) |
//   Rb of GRU's h gate [dirs, hidden] | activations [dirs, 3, 3]: (code, alpha, beta) each.
//
// flags (bits, optcli/gpu/ops_recurrent.py names them): 0 direction 0 runs backwards (direction
// "reverse"; direction 1 always does), 1 sequence_lens given, 2 peepholes, 3 input_forget,
// 4 linear_before_reset, 5 layout 1 (batch first), 6 write Y, 7 write Y_h, 8 write Y_c,
// 9 initial_h given, 10 initial_c given, 11 B given.  clip < 0: no clip.

INLINE int flag(int flags, int bit) {
    return (flags >> bit) & 1;
}

// Element (n, c, h, w) of a packed tensor whose dims (after n) are C, H, W.
INLINE int packed_at(int n, int c, int h, int w, int C, int H, int W) {
    return (((n * ((C + 3) / 4) + c / 4) * H + h) * W + w) * 4 + c % 4;
}

// The recurrent activations the GPU runs, by their fused-epilogue codes (optcli/activation_codes.py).
INLINE float recurrent_act(int code, float v, float alpha, float beta) {
    if (code == 1) return fmax(v, 0.0f);                             // Relu
    if (code == 3) return v >= 0.0f ? v : alpha * v;                 // LeakyRelu
    if (code == 4) return 1.0f / (1.0f + exp(-v));                   // Sigmoid
    if (code == 5) return tanh(v);                                   // Tanh
    if (code == 6) return clamp(alpha * v + beta, 0.0f, 1.0f);       // HardSigmoid
    return v;
}

// clip applies to the pre-activations of the first two activations (the gates), not to LSTM's h(c).
INLINE float clipped(float v, float clip) {
    return clip >= 0.0f ? clamp(v, -clip, clip) : v;
}

// Element (s, b) of X is at x_at(...) + 4 * k for input k; Y_h's (d, b) at state_at(...) + 4 * j.
INLINE int x_at(int s, int b, int seq, int batch, int input, int flags) {
    return flag(flags, 5) ? packed_at(b, s, 0, 0, seq, 1, input) : packed_at(s, b, 0, 0, batch, 1, input);
}

INLINE int state_at(int d, int b, int dirs, int batch, int hidden, int flags) {
    return flag(flags, 5) ? packed_at(b, d, 0, 0, dirs, 1, hidden) : packed_at(d, b, 0, 0, batch, 1, hidden);
}

// xp[d, s, b, g] = bias[d, g] + sum_k X[s, b, k] W[d, g, k]: a work item computes 4 gate columns
// (one float4 of the weight, padded to gh4 * 4 columns) for 4 steps.  grid: (gh4, batch, seq4 * dirs).
KERNEL(recurrent_project, IN(x), IN(w), OUT(xp), INT(seq), INT(batch), INT(input), INT(gh), INT(dirs), INT(flags))
{
    const int g4 = GID(0), b = GID(1), sd = GID(2);
    const int gh4 = (gh + 3) / 4;
    if (g4 >= gh4 || b >= batch || sd >= (seq + 3) / 4 * dirs) return;
    const int s0 = sd / dirs * 4, d = sd % dirs;
    const int x0 = x_at(s0, b, seq, batch, input, flags);
    const int x1 = x_at(min(s0 + 1, seq - 1), b, seq, batch, input, flags);
    const int x2 = x_at(min(s0 + 2, seq - 1), b, seq, batch, input, flags);
    const int x3 = x_at(min(s0 + 3, seq - 1), b, seq, batch, input, flags);
    const int wi = d * (input + 1) * gh4 + g4;
    const FLOAT4 bias = LOAD4(w, wi + input * gh4);
    FLOAT4 a0 = bias, a1 = bias, a2 = bias, a3 = bias;
    for (int k = 0; k < input; ++k) {
        const FLOAT4 wk = LOAD4(w, wi + k * gh4);
        a0 += wk * LOAD1(x, x0 + 4 * k);
        a1 += wk * LOAD1(x, x1 + 4 * k);
        a2 += wk * LOAD1(x, x2 + 4 * k);
        a3 += wk * LOAD1(x, x3 + 4 * k);
    }
    const int g = g4 * 4, n = min(4, gh - g);
    const int o = ((d * seq + s0) * batch + b) * gh + g, stride = batch * gh;
    for (int q = 0; q < n; ++q) {
        const float v0 = q == 0 ? a0.x : (q == 1 ? a0.y : (q == 2 ? a0.z : a0.w));
        const float v1 = q == 0 ? a1.x : (q == 1 ? a1.y : (q == 2 ? a1.z : a1.w));
        const float v2 = q == 0 ? a2.x : (q == 1 ? a2.y : (q == 2 ? a2.z : a2.w));
        const float v3 = q == 0 ? a3.x : (q == 1 ? a3.y : (q == 2 ? a3.z : a3.w));
        STORE1(v0, xp, o + q);
        if (s0 + 1 < seq) STORE1(v1, xp, o + stride + q);
        if (s0 + 2 < seq) STORE1(v2, xp, o + 2 * stride + q);
        if (s0 + 3 < seq) STORE1(v3, xp, o + 3 * stride + q);
    }
}

// The projection and step weights of the head comment, made on the device from W, R, B and P
// (packed, any of them data): for layers whose weights are computed at run time (constant ones
// are re-laid on the host, once).  One work item per element of wproj, then of wstep.  flags:
// bit 2 P given, bit 11 B given.  grid: (projection elements + step elements).
KERNEL(recurrent_weights, IN(w), IN(r), IN(bias), IN(p), IN(acts), OUT(wproj), OUT(wstep), INT(cell), INT(input),
       INT(hidden), INT(dirs), INT(flags))
{
    const int i = GID(0);
    const int gates = cell == 0 ? 4 : (cell == 1 ? 3 : 1);
    const int gh = gates * hidden, gh4 = (gh + 3) / 4 * 4;
    const int nproj = dirs * (input + 1) * gh4;
    if (i < nproj) {
        const int col = i % gh4, k = i / gh4 % (input + 1), d = i / gh4 / (input + 1);
        float v = 0.0f;
        if (col < gh && k < input) {
            v = LOAD1(w, packed_at(d, col, 0, k, gh, 1, input));
        } else if (col < gh && flag(flags, 11)) {  // the folded bias row: Wb + Rb (GRU's h gate: Wb)
            v = LOAD1(bias, packed_at(d, col, 0, 0, 2 * gh, 1, 1));
            if (cell != 1 || col < 2 * hidden) v += LOAD1(bias, packed_at(d, gh + col, 0, 0, 2 * gh, 1, 1));
        }
        STORE1(v, wproj, i);
        return;
    }
    const int e = i - nproj;
    const int rn = dirs * gh * hidden, pn = dirs * 3 * hidden, bn = dirs * hidden;
    float v = 0.0f;
    if (e < rn) {  // R^T: e = (d * hidden + k) * gh + row
        v = LOAD1(r, packed_at(e / gh / hidden, e % gh, 0, e / gh % hidden, gh, 1, hidden));
    } else if (e < rn + pn) {
        const int q = e - rn;
        if (flag(flags, 2)) v = LOAD1(p, packed_at(q / (3 * hidden), q % (3 * hidden), 0, 0, 3 * hidden, 1, 1));
    } else if (e < rn + pn + bn) {
        const int q = e - rn - pn;
        if (cell == 1 && flag(flags, 11))
            v = LOAD1(bias, packed_at(q / hidden, gh + 2 * hidden + q % hidden, 0, 0, 2 * gh, 1, 1));
    } else if (e < rn + pn + bn + dirs * 9) {
        v = LOAD1(acts, e - rn - pn - bn);
    } else {
        return;
    }
    STORE1(v, wstep, e);
}

// The states h (and LSTM's c) from initial_h / initial_c, zeros where absent.  grid: (hidden, batch, dirs).
KERNEL(recurrent_init, IN(h0), IN(c0), OUT(h), OUT(c), INT(cell), INT(batch), INT(hidden), INT(dirs), INT(flags))
{
    const int j = GID(0), b = GID(1), d = GID(2);
    if (j >= hidden || b >= batch || d >= dirs) return;
    const int at = state_at(d, b, dirs, batch, hidden, flags) + 4 * j;
    const int here = (d * batch + b) * hidden + j;
    STORE1(flag(flags, 9) ? LOAD1(h0, at) : 0.0f, h, here);
    if (cell == 0) STORE1(flag(flags, 10) ? LOAD1(c0, at) : 0.0f, c, here);
}

// Time steps t0 .. t1 - 1 of every direction (direction d at sequence index s: t, or seq - 1 - t
// running backwards).  cell: 0 LSTM, 1 GRU, 2 RNN.  phases (bits): 1 GRU's reset with
// linear_before_reset 0, rh = r * h(t-1), r = f(xp_r + R_r h(t-1)), which every hidden unit's h
// gate needs whole; 2 the update of h (and LSTM's c).  Two ways to launch it (ops_recurrent.py):
//   whole sequence (t1 - t0 > 1): one work-group per (batch row, direction), grid (L, batch, dirs),
//     local (L, 1, 1); its work items take the hidden units L apart, and a barrier ends each phase,
//     so a layer is one launch, not one per step (launches cost microseconds each on a GPU, and a
//     speech model's step is a few hundred multiply-adds per unit).  Should a local size split x
//     over several work-groups (a tuned one), the first does it all and the others return.
//   one step per launch (t1 = t0 + 1): grid (hidden, batch, dirs), any work-groups; the launches'
//     order separates the steps and the phases (GRU's reset first: phases 1, then 2).
// hs holds h(t) at (t % 2) * dirs * batch * hidden (ping-pong: every unit reads all of h(t-1));
// cs is LSTM's c, each unit read and written only by its own work item.  Rows past their sequence
// length keep their state and give zeros in Y; a row of length 0 ends in zeros.  Y_h / Y_c are
// written at the last step (flags bits 7 and 8).
KERNEL(recurrent_steps, IN(xp), IN(wts), IN(lens), OUT(hs), OUT(cs), OUT(rh), OUT(y), OUT(yh), OUT(yc),
       INT(cell), INT(t0), INT(t1), INT(phases), INT(seq), INT(batch), INT(hidden), INT(dirs), INT(flags),
       FLOAT(clip))
{
    const int b = GID(1), d = GID(2);
    if (b >= batch || d >= dirs) return;  // whole work-groups: the local size is 1 along y and z
    const int whole = t1 - t0 > 1;
    if (whole && GID(0) >= LSIZE(0)) return;  // the first work-group along x runs the sequence
    const int first = whole ? LID(0) : GID(0), stride = whole ? LSIZE(0) : GSIZE(0);
    const int gates = cell == 0 ? 4 : (cell == 1 ? 3 : 1);
    const int gh = gates * hidden, gate = hidden;  // R^T[d, k, g * hidden + j]: the units of a gate side by side
    const int state = dirs * batch * hidden, row = (d * batch + b) * hidden;
    const int peep = dirs * hidden * gh, rbh = peep + dirs * 3 * hidden, act = rbh + dirs * hidden + d * 9;
    const int reset_first = cell == 1 && !flag(flags, 4);
    float code[3], alpha[3], beta[3];
    for (int k = 0; k < 3; ++k) {
        code[k] = LOAD1(wts, act + 3 * k);
        alpha[k] = LOAD1(wts, act + 3 * k + 1);
        beta[k] = LOAD1(wts, act + 3 * k + 2);
    }
    const int len = flag(flags, 1) ? (int)LOAD1(lens, b) : seq;
    for (int t = t0; t < t1; ++t) {
        const int s = (d == 1 || flag(flags, 0)) ? seq - 1 - t : t;
        const int hp = (t % 2) * state + row, hn = ((t + 1) % 2) * state + row;
        const int xrow = ((d * seq + s) * batch + b) * gh;
        const int rt = d * hidden * gh;  // R^T of direction d
        if (phases & 1) {
            for (int j = first; j < hidden; j += stride) {
                float acc = LOAD1(xp, xrow + gate + j);
                for (int k = 0; k < hidden; ++k) acc = FMA(LOAD1(wts, rt + k * gh + gate + j), LOAD1(hs, hp + k), acc);
                const float r = recurrent_act((int)code[0], clipped(acc, clip), alpha[0], beta[0]);
                STORE1(r * LOAD1(hs, hp + j), rh, row + j);
            }
            if (whole) BARRIER();
        }
        if (!(phases & 2)) continue;
        for (int j = first; j < hidden; j += stride) {
            // the recurrent products R h(t-1), gate by gate; GRU's h gate takes r * h(t-1) when the
            // reset comes first (linear_before_reset 0), and then needs no r here
            float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
            const int r0 = rt + j;
            if (cell == 0) {
                for (int k = 0; k < hidden; ++k) {
                    const float hk = LOAD1(hs, hp + k);
                    const int rk = r0 + k * gh;
                    a0 = FMA(LOAD1(wts, rk), hk, a0);
                    a1 = FMA(LOAD1(wts, rk + gate), hk, a1);
                    a2 = FMA(LOAD1(wts, rk + 2 * gate), hk, a2);
                    a3 = FMA(LOAD1(wts, rk + 3 * gate), hk, a3);
                }
            } else if (reset_first) {
                for (int k = 0; k < hidden; ++k) {
                    const int rk = r0 + k * gh;
                    a0 = FMA(LOAD1(wts, rk), LOAD1(hs, hp + k), a0);
                    a2 = FMA(LOAD1(wts, rk + 2 * gate), LOAD1(rh, row + k), a2);
                }
            } else if (cell == 1) {
                for (int k = 0; k < hidden; ++k) {
                    const float hk = LOAD1(hs, hp + k);
                    const int rk = r0 + k * gh;
                    a0 = FMA(LOAD1(wts, rk), hk, a0);
                    a1 = FMA(LOAD1(wts, rk + gate), hk, a1);
                    a2 = FMA(LOAD1(wts, rk + 2 * gate), hk, a2);
                }
            } else {
                for (int k = 0; k < hidden; ++k) a0 = FMA(LOAD1(wts, r0 + k * gh), LOAD1(hs, hp + k), a0);
            }
            const int xi = xrow + j;
            const float hprev = LOAD1(hs, hp + j);
            const float cprev = cell == 0 ? LOAD1(cs, row + j) : 0.0f;
            float h, c = cprev;
            if (cell == 0) {  // LSTM: gates i, o, f, c
                float gi = LOAD1(xp, xi) + a0, go = LOAD1(xp, xi + gate) + a1;
                float gf = LOAD1(xp, xi + 2 * gate) + a2, gc = LOAD1(xp, xi + 3 * gate) + a3;
                const int p = peep + d * 3 * hidden + j;
                if (flag(flags, 2)) {
                    gi = FMA(LOAD1(wts, p), cprev, gi);
                    gf = FMA(LOAD1(wts, p + 2 * hidden), cprev, gf);
                }
                const float i = recurrent_act((int)code[0], clipped(gi, clip), alpha[0], beta[0]);
                const float f = flag(flags, 3) ? 1.0f - i
                                               : recurrent_act((int)code[0], clipped(gf, clip), alpha[0], beta[0]);
                c = f * cprev + i * recurrent_act((int)code[1], clipped(gc, clip), alpha[1], beta[1]);
                if (flag(flags, 2)) go = FMA(LOAD1(wts, p + hidden), c, go);
                h = recurrent_act((int)code[0], clipped(go, clip), alpha[0], beta[0]) *
                    recurrent_act((int)code[2], c, alpha[2], beta[2]);
            } else if (cell == 1) {  // GRU: gates z, r, h
                const float z = recurrent_act((int)code[0], clipped(LOAD1(xp, xi) + a0, clip), alpha[0], beta[0]);
                const float rb = LOAD1(wts, rbh + d * hidden + j);
                float gh_pre = LOAD1(xp, xi + 2 * gate);  // the h gate's pre-activation
                if (reset_first) {
                    gh_pre += a2 + rb;
                } else {
                    const float r = recurrent_act((int)code[0], clipped(LOAD1(xp, xi + gate) + a1, clip), alpha[0],
                                                  beta[0]);
                    gh_pre += r * (a2 + rb);
                }
                h = (1.0f - z) * recurrent_act((int)code[1], clipped(gh_pre, clip), alpha[1], beta[1]) + z * hprev;
            } else {  // RNN
                h = recurrent_act((int)code[0], clipped(LOAD1(xp, xi) + a0, clip), alpha[0], beta[0]);
            }
            const int live = s < len;
            if (!live) {
                h = hprev;
                c = cprev;
            }
            STORE1(h, hs, hn + j);
            if (cell == 0) STORE1(c, cs, row + j);
            if (flag(flags, 6)) {
                // Y's lanes run over directions (layout 0) or steps (layout 1); the last one of each
                // slice clears the padding lanes after it
                const int lane = flag(flags, 5) ? s : d, lanes = flag(flags, 5) ? seq : dirs;
                const int at = flag(flags, 5) ? packed_at(b, s, d, j, seq, dirs, hidden)
                                              : packed_at(s, d, b, j, dirs, batch, hidden);
                STORE1(live ? h : 0.0f, y, at);
                if (lane == lanes - 1) {
                    for (int l = lane % 4 + 1; l < 4; ++l) STORE1(0.0f, y, at + l - lane % 4);
                }
            }
            if (t == seq - 1 && (flag(flags, 7) || flag(flags, 8))) {
                // Y_h / Y_c, lanes over batch (layout 1: directions)
                const int lane = flag(flags, 5) ? d : b, lanes = flag(flags, 5) ? dirs : batch;
                const int at = state_at(d, b, dirs, batch, hidden, flags) + 4 * j;
                const int pad = lane == lanes - 1 ? lane % 4 + 1 : 4;
                const int ended = len == 0;
                if (flag(flags, 7)) {
                    STORE1(ended ? 0.0f : h, yh, at);
                    for (int l = pad; l < 4; ++l) STORE1(0.0f, yh, at + l - lane % 4);
                }
                if (flag(flags, 8)) {
                    STORE1(ended ? 0.0f : c, yc, at);
                    for (int l = pad; l < 4; ++l) STORE1(0.0f, yc, at + l - lane % 4);
                }
            }
        }
        if (whole) BARRIER();
    }
}
