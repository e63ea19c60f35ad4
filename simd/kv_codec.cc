// The scalar codec of the quantized KV vectors (layouts and rationale in kv_quant.h): quantize and
// dequantize one vector. Plain C++, no SIMD: the stored bytes are the same on every machine and
// target, so segment files and their hashes do not depend on the CPU that wrote them.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "simd/f16.h"
#include "simd/kv_layout.h"
#include "simd/kv_quant.h"

namespace towers::simd {

namespace {
using namespace kvq;  // NOLINT

constexpr float kF16Max = 65504.0f;

// Round to nearest, ties to even, for |x| < 2^22 (the default rounding mode; no libm call).
inline float round_even(float x) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  return (x + kMagic) - kMagic;
}

// Largest f16 <= f, smallest f16 >= f (|f| <= 65504, so neither overflows to inf).
uint16_t f16_down(float f) {
  uint16_t h = f32_to_fp16(f);
  if (fp16_to_f32(h) > f) {
    if (h == 0x0000) h = 0x8001;
    else if (h & 0x8000) ++h;
    else --h;
  }
  return h;
}
uint16_t f16_up(float f) {
  uint16_t h = f32_to_fp16(f);
  if (fp16_to_f32(h) < f) {
    if (h == 0x8000) h = 0x0001;
    else if (h & 0x8000) --h;
    else ++h;
  }
  return h;
}

// NaN -> 0, then clamp to the f16 range.
inline float sanitize(float x) {
  const float v = x == x ? x : 0.0f;
  return std::min(std::max(v, -kF16Max), kF16Max);
}

void put_f16(uint8_t* dst, uint16_t h) { std::memcpy(dst, &h, 2); }
uint16_t get_f16(const uint8_t* src) {
  uint16_t h;
  std::memcpy(&h, src, 2);
  return h;
}

// Where element e's low 4 bits (nibble plane) and high 2 bits (Q6's 2-bit plane) are.
struct CodePos {
  int byte, shift;
};
CodePos nibble_pos(int e, int dim) {
  const int fp = dim / 16;  // whole pairs of groups: byte 8P + k = element k (low) | 8 + k (high)
  if (e < 16 * fp) return {8 * (e / 16) + e % 8, 4 * ((e % 16) / 8)};
  const int t = e - 16 * fp;  // a last single group: sequential
  return {8 * fp + t / 2, 4 * (t % 2)};
}
CodePos high_pos(int e, int dim) {
  const int fq = dim / 32;  // whole blocks: byte 8Q + k = elements k, 8+k, 16+k, 24+k at bits 0,2,4,6
  if (e < 32 * fq) return {8 * (e / 32) + e % 8, 2 * ((e % 32) / 8)};
  const int t = e - 32 * fq;  // the last, partial block: sequential
  return {8 * fq + t / 4, 2 * (t % 4)};
}

// Codes of one asymmetric block of len elements (levels = 15 or 63); writes d, m; codes to c[].
void quantize_asym(const float* x, int len, int levels, uint8_t* dm, uint8_t* c) {
  float xs[kKvBlock];
  float mn = kF16Max, mx = -kF16Max;  // len >= 1
  for (int i = 0; i < len; ++i) {
    xs[i] = sanitize(x[i]);
    mn = std::min(mn, xs[i]);
    mx = std::max(mx, xs[i]);
  }
  const uint16_t mh = f16_down(mn);
  const float m = fp16_to_f32(mh);
  const uint16_t dh = f16_up((mx - m) / static_cast<float>(levels));
  const float d = fp16_to_f32(dh);
  put_f16(dm, dh);
  put_f16(dm + 2, mh);
  const float top = static_cast<float>(levels);
  for (int i = 0; i < len; ++i) {
    const float r = d > 0.0f ? round_even((xs[i] - m) / d) : 0.0f;
    c[i] = static_cast<uint8_t>(std::min(std::max(r, 0.0f), top));
  }
}

}  // namespace

const char* kv_quant_name(KvQuant q) {
  switch (q) {
    case KvQuant::F32: return "f32";
    case KvQuant::F16: return "f16";
    case KvQuant::Q8: return "q8";
    case KvQuant::Q6: return "q6";
    case KvQuant::Q4: return "q4";
  }
  return "?";
}

bool kv_quant_ok(KvQuant q, int dim) { return quant_ok(q, dim); }

size_t kv_vec_bytes(KvQuant q, int dim) { return vec_bytes(q, dim); }

void kv_quantize(KvQuant q, const float* x, void* dst, int dim) {
  if (!kv_quant_ok(q, dim)) return;
  auto* out = static_cast<uint8_t*>(dst);
  const int nb = n_blocks(dim);
  const size_t hdr = header_bytes(q, dim);
  switch (q) {
    case KvQuant::F32:
      std::memcpy(out, x, sizeof(float) * size_t(dim));
      return;
    case KvQuant::F16:
      for (int i = 0; i < dim; ++i) put_f16(out + 2 * i, f32_to_fp16(sanitize(x[i])));
      return;
    case KvQuant::Q8:
      for (int b = 0; b < nb; ++b) {
        const int e0 = b * kKvBlock, len = std::min(dim - e0, kKvBlock);
        float xs[kKvBlock];
        float amax = 0.0f;
        for (int i = 0; i < len; ++i) {
          xs[i] = sanitize(x[e0 + i]);
          amax = std::max(amax, std::fabs(xs[i]));
        }
        const uint16_t dh = f16_up(amax / 127.0f);
        const float d = fp16_to_f32(dh);
        put_f16(out + 2 * b, dh);
        auto* c = reinterpret_cast<int8_t*>(out + hdr + e0);
        for (int i = 0; i < len; ++i) {
          const float r = d > 0.0f ? round_even(xs[i] / d) : 0.0f;
          c[i] = static_cast<int8_t>(std::min(std::max(r, -127.0f), 127.0f));
        }
      }
      return;
    case KvQuant::Q6:
    case KvQuant::Q4: {
      const int levels = q == KvQuant::Q6 ? 63 : 15;
      uint8_t codes[kKvMaxDim];
      for (int b = 0; b < nb; ++b) {
        const int e0 = b * kKvBlock;
        quantize_asym(x + e0, std::min(dim - e0, kKvBlock), levels, out + 4 * b, codes + e0);
      }
      // Nibble plane: runs of 16 (byte 8R + k = element 16R + k | 16R + 8 + k << 4), then a last
      // group of 8 in order.
      uint8_t* lo = out + hdr;
      const int runs = dim / 16;
      for (int r = 0; r < runs; ++r) {
        for (int k = 0; k < 8; ++k) {
          lo[8 * r + k] = static_cast<uint8_t>((codes[16 * r + k] & 15) | ((codes[16 * r + 8 + k] & 15) << 4));
        }
      }
      for (int e = 16 * runs; e < dim; e += 2) {
        lo[e / 2] = static_cast<uint8_t>((codes[e] & 15) | ((codes[e + 1] & 15) << 4));
      }
      if (q == KvQuant::Q6) {
        // 2-bit plane: whole blocks (byte 8Q + k = elements 32Q + k + 8g at bits 2g), then the last
        // partial block in order, four per byte.
        uint8_t* hi = lo + dim / 2;
        const int whole = dim / 32;
        for (int Q = 0; Q < whole; ++Q) {
          for (int k = 0; k < 8; ++k) {
            const uint8_t* c = codes + 32 * Q + k;
            hi[8 * Q + k] = static_cast<uint8_t>((c[0] >> 4) | ((c[8] >> 4) << 2) | ((c[16] >> 4) << 4) | ((c[24] >> 4) << 6));
          }
        }
        for (int e = 32 * whole; e < dim; e += 4) {
          const uint8_t* c = codes + e;
          hi[e / 4] = static_cast<uint8_t>((c[0] >> 4) | ((c[1] >> 4) << 2) | ((c[2] >> 4) << 4) | ((c[3] >> 4) << 6));
        }
      }
      return;
    }
  }
}

void kv_dequantize(KvQuant q, const void* src, float* x, int dim) {
  if (!kv_quant_ok(q, dim)) return;
  const auto* in = static_cast<const uint8_t*>(src);
  const size_t hdr = header_bytes(q, dim);
  switch (q) {
    case KvQuant::F32:
      std::memcpy(x, in, sizeof(float) * size_t(dim));
      return;
    case KvQuant::F16:
      for (int i = 0; i < dim; ++i) x[i] = fp16_to_f32(get_f16(in + 2 * i));
      return;
    case KvQuant::Q8: {
      const auto* c = reinterpret_cast<const int8_t*>(in + hdr);
      for (int i = 0; i < dim; ++i) x[i] = fp16_to_f32(get_f16(in + 2 * (i / kKvBlock))) * static_cast<float>(c[i]);
      return;
    }
    case KvQuant::Q6:
    case KvQuant::Q4: {
      const uint8_t* lo = in + hdr;
      const uint8_t* hi = lo + dim / 2;
      for (int i = 0; i < dim; ++i) {
        const int b = i / kKvBlock;
        const float d = fp16_to_f32(get_f16(in + 4 * b)), m = fp16_to_f32(get_f16(in + 4 * b + 2));
        const CodePos lp = nibble_pos(i, dim);
        int c = (lo[lp.byte] >> lp.shift) & 15;
        if (q == KvQuant::Q6) {
          const CodePos hp = high_pos(i, dim);
          c |= ((hi[hp.byte] >> hp.shift) & 3) << 4;
        }
        x[i] = m + d * static_cast<float>(c);  // d*c is exact (11 x 6 significant bits)
      }
      return;
    }
  }
}


}  // namespace towers::simd
