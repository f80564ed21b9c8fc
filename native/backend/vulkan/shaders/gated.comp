// OUT (n,) = act(G) * U for the gated FFNs. act 0: SiLU g / (1 + exp(-g)) (SwiGLU);
// act 1: GELU by its tanh approximation 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) (GeGLU).
#version 450

#define THREADS 256
// tanh's argument is clamped here: tanh(15) rounds to 1 in float, and some drivers' tanh
// overflows to NaN for large arguments.
#define TANH_CLAMP 15.0

layout(local_size_x = THREADS) in;
layout(std430, binding = 0) readonly buffer Gb { float g[]; };
layout(std430, binding = 1) readonly buffer Ub { float u[]; };
layout(std430, binding = 2) writeonly buffer Ob { float o[]; };
layout(push_constant) uniform Params {
  uint n;
  uint act;
} p;

void main() {
  const uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * THREADS;
  if (i >= p.n) return;
  const float v = g[i];
  float a;
  if (p.act == 0u) {
    a = v / (1.0 + exp(-v));
  } else {
    const float z = clamp(0.7978845608028654 * v * (1.0 + 0.044715 * v * v), -TANH_CLAMP, TANH_CLAMP);
    a = 0.5 * v * (1.0 + tanh(z));
  }
  o[i] = a * u[i];
}
