// One time step of a forward LSTM (ONNX gate order i, o, f, c; sigmoid / tanh / tanh; no
// peepholes): one work item per (hidden unit, batch row).  The host enqueues one launch per
// step, ping-ponging the state buffers, so no barrier is needed between steps.
//
// Layouts: x is X[seq, batch, input] packed as (seq, batch, 1, input); the states hp/cp/hn/cn are
// [1, batch, hidden] packed as (1, batch, 1, hidden) (the layout of Y_h / Y_c, so the last step
// writes straight into them); y is Y[seq, 1, batch, hidden] packed as (seq, 1, batch, hidden).
// w [4 * hidden, input], r [4 * hidden, hidden] and bias [4 * hidden] (Wb + Rb) are plain.

INLINE float sigmoid1(float v) {
    return 1.0f / (1.0f + exp(-v));
}

KERNEL(lstm_step, IN(x), IN(w), IN(r), IN(bias), IN(hp), IN(cp), OUT(hn), OUT(cn), OUT(y),
       INT(t), INT(batch), INT(input), INT(hidden), INT(write_y))
{
    const int j = GID(0);
    const int b = GID(1);
    if (j >= hidden) return;
    const int lane = b % 4;
    const int state = ((b / 4) * hidden + j) * 4 + lane;
    if (b >= batch) {  // padding lanes of the packed state
        STORE1(0.0f, hn, state);
        STORE1(0.0f, cn, state);
        return;
    }
    const int xrow = (t * ((batch + 3) / 4) + b / 4) * input * 4 + lane;
    const int hrow = (b / 4) * hidden * 4 + lane;
    float gate[4];
    for (int q = 0; q < 4; ++q) {
        const int row = q * hidden + j;
        float acc = LOAD1(bias, row);
        for (int k = 0; k < input; ++k) acc = FMA(LOAD1(w, row * input + k), LOAD1(x, xrow + k * 4), acc);
        for (int k = 0; k < hidden; ++k) acc = FMA(LOAD1(r, row * hidden + k), LOAD1(hp, hrow + k * 4), acc);
        gate[q] = acc;
    }
    const float c = sigmoid1(gate[2]) * LOAD1(cp, state) + sigmoid1(gate[0]) * tanh(gate[3]);
    const float h = sigmoid1(gate[1]) * tanh(c);
    STORE1(c, cn, state);
    STORE1(h, hn, state);
    if (write_y) STORE4(F4(h, 0.0f, 0.0f, 0.0f), y, (t * batch + b) * hidden + j);
}
