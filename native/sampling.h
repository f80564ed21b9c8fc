// Drawing a sequence's next token from its row of logits, after the engine has applied the token
// mask (masked tokens at -inf) and the repetition penalty.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/kernels.h"

namespace kvs {

// Buffers one draw needs, kept between draws so a token costs no allocation.
struct DrawScratch {
  std::vector<float> logits;  // the engine's copy of a row it masks or penalizes
  std::vector<float> p;
  std::vector<int32_t> idx;
  std::vector<double> pd;
};

// temperature <= 0: the first largest logit. Otherwise a draw from softmax(l / temperature) over the
// top_k most likely tokens (0 or >= nv: every token), cut to the smallest most likely set whose mass
// reaches top_p (1: no cut); ties in likelihood rank the lower token id first. Masked tokens (-inf)
// are never drawn.
int32_t draw_token(const float* l, int nv, float temperature, int top_k, float top_p, std::mt19937_64& rng,
                   const Kernels& kern, DrawScratch& scratch);

}  // namespace kvs
