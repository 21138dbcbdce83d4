// The whole model (vision tower + decoder) on the CPU backend against an independent naive
// implementation in double precision written from the spec (qwen3vl-spec.md §5–6), over the
// same random weights (random_model.h), for the tiny presets. This checks the wiring of every
// stage (residuals, merge order, deepstack taps and injection, GQA head mapping, M-RoPE axes,
// tied and untied lm_head) before the transformers fixtures are available; the golden tests
// then check the same stages against transformers itself.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/presets.h"
#include "model/runner.h"
#include "random_model.h"
#include "support/test_support.h"
#include "support/tolerances.h"

namespace qvl {
namespace {

using Mat = std::vector<double>;  // row-major; the column count travels separately

double at(const Tensor& t, int64_t i) {
  if (t.dtype == DType::kBF16) return bf16_to_float(t.as<const uint16_t>()[i]);
  QVL_CHECK(t.dtype == DType::kF32) << t.describe();
  return t.as<const float>()[i];
}

// y = x · Wᵀ + b with W the stacked parts.
Mat lin(const Mat& x, int64_t n, const LinearWeight& w) {
  const int64_t K = w.in_features, O = w.out_features;
  Mat y(n * O, 0.0);
  int64_t col = 0;
  for (const LinearPart& p : w.parts) {
    for (int64_t j = 0; j < p.weight.dim(0); ++j, ++col)
      for (int64_t i = 0; i < n; ++i) {
        double s = w.bias.empty() ? 0.0 : at(w.bias, col);
        for (int64_t k = 0; k < K; ++k) s += x[i * K + k] * at(p.weight, j * K + k);
        y[i * O + col] = s;
      }
  }
  return y;
}

void layer_norm(Mat& x, int64_t n, int64_t D, const Tensor& w, const Tensor& b) {
  for (int64_t i = 0; i < n; ++i) {
    double m = 0, v = 0;
    for (int64_t j = 0; j < D; ++j) m += x[i * D + j];
    m /= D;
    for (int64_t j = 0; j < D; ++j) v += (x[i * D + j] - m) * (x[i * D + j] - m);
    v /= D;
    for (int64_t j = 0; j < D; ++j) x[i * D + j] = (x[i * D + j] - m) / std::sqrt(v + 1e-6) * at(w, j) + at(b, j);
  }
}

void rms_norm(double* x, int64_t D, const Tensor& w) {
  double ss = 0;
  for (int64_t j = 0; j < D; ++j) ss += x[j] * x[j];
  const double r = 1.0 / std::sqrt(ss / D + 1e-6);
  for (int64_t j = 0; j < D; ++j) x[j] = at(w, j) * x[j] * r;
}

// x·cos(θ) + rotate_half(x)·sin(θ), θ[d] = angle[d mod dh/2].
void rope(double* x, int dh, const std::vector<double>& angle) {
  std::vector<double> y(x, x + dh);
  for (int d = 0; d < dh; ++d) {
    const double a = angle[d % (dh / 2)];
    const double rot = d < dh / 2 ? -y[d + dh / 2] : y[d - dh / 2];
    x[d] = y[d] * std::cos(a) + rot * std::sin(a);
  }
}

// softmax(q·kᵀ·scale)·v for one query over keys [0, len).
void attend(const double* q, const std::vector<const double*>& k, const std::vector<const double*>& v, int dh,
            double* out) {
  std::vector<double> s(k.size());
  double mx = -1e300, sum = 0;
  for (size_t t = 0; t < k.size(); ++t) {
    double d = 0;
    for (int e = 0; e < dh; ++e) d += q[e] * k[t][e];
    s[t] = d / std::sqrt(double(dh));
    mx = std::max(mx, s[t]);
  }
  for (double& x : s) sum += (x = std::exp(x - mx));
  for (int e = 0; e < dh; ++e) {
    double acc = 0;
    for (size_t t = 0; t < k.size(); ++t) acc += s[t] / sum * v[t][e];
    out[e] = acc;
  }
}

double gelu_tanh(double z) {
  return 0.5 * z * (1 + std::tanh(std::sqrt(2 / M_PI) * (z + 0.044715 * z * z * z)));
}
double gelu_erf(double z) {
  return 0.5 * z * (1 + std::erf(z / std::sqrt(2.0)));
}

struct VisionRef {
  Mat merged;
  std::vector<Mat> deepstack;
};

VisionRef vision_reference(const ModelConfig& cfg, const ModelWeights& w, const std::vector<std::vector<float>>& px,
                           const std::vector<ImageGrid>& grids) {
  const VisionConfig& v = cfg.vision;
  const int64_t D = v.hidden_size, U = v.merge_unit();
  const int nh = v.num_heads, dh = v.head_dim(), S = static_cast<int>(std::sqrt(v.num_position_embeddings));
  Mat pix;
  std::vector<std::array<int, 3>> patch;  // (image, row, col)
  for (size_t g = 0; g < grids.size(); ++g) {
    pix.insert(pix.end(), px[g].begin(), px[g].end());
    for (int hb = 0; hb < grids[g].h / 2; ++hb)
      for (int wb = 0; wb < grids[g].w / 2; ++wb)
        for (int hi = 0; hi < 2; ++hi)
          for (int wi = 0; wi < 2; ++wi) patch.push_back({static_cast<int>(g), 2 * hb + hi, 2 * wb + wi});
  }
  const int64_t N = static_cast<int64_t>(patch.size());
  Mat x = lin(pix, N, w.vision.patch_embed);
  for (int64_t i = 0; i < N; ++i) {  // bilinear position embedding, align_corners
    const ImageGrid& g = grids[patch[i][0]];
    const double yr = g.h == 1 ? 0 : patch[i][1] * (S - 1.0) / (g.h - 1);
    const double xc = g.w == 1 ? 0 : patch[i][2] * (S - 1.0) / (g.w - 1);
    const int r0 = int(std::floor(yr)), c0 = int(std::floor(xc)), r1 = std::min(r0 + 1, S - 1),
              c1 = std::min(c0 + 1, S - 1);
    const double dy = yr - r0, dx = xc - c0;
    for (int64_t j = 0; j < D; ++j)
      x[i * D + j] += (1 - dy) * (1 - dx) * at(w.vision.pos_embed, (r0 * S + c0) * D + j) +
                      (1 - dy) * dx * at(w.vision.pos_embed, (r0 * S + c1) * D + j) +
                      dy * (1 - dx) * at(w.vision.pos_embed, (r1 * S + c0) * D + j) +
                      dy * dx * at(w.vision.pos_embed, (r1 * S + c1) * D + j);
  }
  std::vector<std::vector<double>> angle(N, std::vector<double>(dh / 2));
  for (int64_t i = 0; i < N; ++i)
    for (int e = 0; e < dh / 2; ++e) {
      const int q = dh / 4;
      angle[i][e] = (e < q ? patch[i][1] : patch[i][2]) * std::pow(10000.0, -2.0 * (e % q) / (dh / 2));
    }
  auto merger = [&](const MergerWeights& m, Mat in) {
    const int64_t M = N / U;
    if (m.postshuffle_norm)
      layer_norm(in, M, U * D, m.norm_w, m.norm_b);
    else
      layer_norm(in, N, D, m.norm_w, m.norm_b);
    Mat h = lin(in, M, m.fc1);
    for (double& z : h) z = gelu_erf(z);
    return lin(h, M, m.fc2);
  };
  VisionRef out;
  out.deepstack.resize(v.deepstack_visual_indexes.size());
  for (int b = 0; b < v.depth; ++b) {
    const VisionBlockWeights& bw = w.vision.blocks[b];
    Mat h = x;
    layer_norm(h, N, D, bw.norm1_w, bw.norm1_b);
    Mat qkv = lin(h, N, bw.qkv);
    for (int64_t i = 0; i < N; ++i)
      for (int part = 0; part < 2; ++part)
        for (int hh = 0; hh < nh; ++hh) rope(&qkv[i * 3 * D + part * D + hh * dh], dh, angle[i]);
    Mat attn(N * D);
    for (int64_t i = 0; i < N; ++i)
      for (int hh = 0; hh < nh; ++hh) {
        std::vector<const double*> ks, vs;
        for (int64_t j = 0; j < N; ++j)
          if (patch[j][0] == patch[i][0]) {  // same image only
            ks.push_back(&qkv[j * 3 * D + D + hh * dh]);
            vs.push_back(&qkv[j * 3 * D + 2 * D + hh * dh]);
          }
        attend(&qkv[i * 3 * D + hh * dh], ks, vs, dh, &attn[i * D + hh * dh]);
      }
    Mat o = lin(attn, N, bw.proj);
    for (int64_t i = 0; i < N * D; ++i) x[i] += o[i];
    h = x;
    layer_norm(h, N, D, bw.norm2_w, bw.norm2_b);
    Mat f = lin(h, N, bw.fc1);
    for (double& z : f) z = gelu_tanh(z);
    o = lin(f, N, bw.fc2);
    for (int64_t i = 0; i < N * D; ++i) x[i] += o[i];
    for (size_t j = 0; j < v.deepstack_visual_indexes.size(); ++j)
      if (v.deepstack_visual_indexes[j] == b) out.deepstack[j] = merger(w.vision.deepstack_mergers[j], x);
  }
  out.merged = merger(w.vision.merger, x);
  return out;
}

// Last-position logits of the whole model for `ids`.
std::vector<double> model_reference(const ModelConfig& cfg, const ModelWeights& w, const std::vector<int32_t>& ids,
                                    const VisionRef& vis, const PromptPositions& pos) {
  const TextConfig& t = cfg.text;
  const int64_t L = static_cast<int64_t>(ids.size()), H = t.hidden_size, dh = t.head_dim;
  const int hq = t.num_attention_heads, hkv = t.num_key_value_heads;
  Mat x(L * H);
  std::vector<int64_t> image_rows;
  for (int64_t i = 0; i < L; ++i) {
    if (ids[i] == cfg.tokens.image_token_id) {
      const int64_t r = static_cast<int64_t>(image_rows.size());
      for (int64_t j = 0; j < H; ++j) x[i * H + j] = vis.merged[r * H + j];
      image_rows.push_back(i);
    } else {
      for (int64_t j = 0; j < H; ++j) x[i * H + j] = at(w.text.embed_tokens, ids[i] * H + j);
    }
  }
  // Interleaved M-RoPE angles per token: frequency j reads axis H if j%3==1, W if j%3==2 (inside
  // the H/W sections), T otherwise.
  std::vector<std::vector<double>> angle(L, std::vector<double>(dh / 2));
  for (int64_t i = 0; i < L; ++i)
    for (int j = 0; j < dh / 2; ++j) {
      int axis = 0;
      if (j % 3 == 1 && j < 3 * t.mrope_section[1]) axis = 1;
      if (j % 3 == 2 && j < 3 * t.mrope_section[2]) axis = 2;
      angle[i][j] = pos.positions[i * 3 + axis] * std::pow(t.rope_theta, -2.0 * j / dh);
    }
  const int64_t qd = hq * dh, kd = hkv * dh;
  for (int l = 0; l < t.num_hidden_layers; ++l) {
    const DecoderLayerWeights& lw = w.text.layers[l];
    Mat h = x;
    for (int64_t i = 0; i < L; ++i) rms_norm(&h[i * H], H, lw.input_norm);
    Mat qkv = lin(h, L, lw.qkv);
    const int64_t width = qd + 2 * kd;
    for (int64_t i = 0; i < L; ++i) {
      for (int hh = 0; hh < hq; ++hh) {
        rms_norm(&qkv[i * width + hh * dh], dh, lw.q_norm);
        rope(&qkv[i * width + hh * dh], dh, angle[i]);
      }
      for (int hh = 0; hh < hkv; ++hh) {
        rms_norm(&qkv[i * width + qd + hh * dh], dh, lw.k_norm);
        rope(&qkv[i * width + qd + hh * dh], dh, angle[i]);
      }
    }
    Mat attn(L * qd);
    for (int64_t i = 0; i < L; ++i)
      for (int hh = 0; hh < hq; ++hh) {
        const int g = hh / (hq / hkv);
        std::vector<const double*> ks, vs;
        for (int64_t j = 0; j <= i; ++j) {  // causal
          ks.push_back(&qkv[j * width + qd + g * dh]);
          vs.push_back(&qkv[j * width + qd + kd + g * dh]);
        }
        attend(&qkv[i * width + hh * dh], ks, vs, static_cast<int>(dh), &attn[i * qd + hh * dh]);
      }
    Mat o = lin(attn, L, lw.o);
    for (int64_t i = 0; i < L * H; ++i) x[i] += o[i];
    h = x;
    for (int64_t i = 0; i < L; ++i) rms_norm(&h[i * H], H, lw.post_attention_norm);
    Mat gu = lin(h, L, lw.gate_up);
    const int64_t I = t.intermediate_size;
    Mat a(L * I);
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j < I; ++j) {
        const double g = gu[i * 2 * I + j];
        a[i * I + j] = g / (1 + std::exp(-g)) * gu[i * 2 * I + I + j];
      }
    o = lin(a, L, lw.down);
    for (int64_t i = 0; i < L * H; ++i) x[i] += o[i];
    if (l < static_cast<int>(vis.deepstack.size()))
      for (size_t r = 0; r < image_rows.size(); ++r)
        for (int64_t j = 0; j < H; ++j) x[image_rows[r] * H + j] += vis.deepstack[l][r * H + j];
  }
  Mat last(x.end() - H, x.end());
  rms_norm(last.data(), H, w.text.final_norm);
  return lin(last, 1, w.text.lm_head);
}

class ModelReference : public ::testing::TestWithParam<std::string> {};

TEST_P(ModelReference, LogitsAndVisionMatchNaiveDouble) {
  auto cfg = preset_config(GetParam());
  ASSERT_TRUE(cfg.is_ok()) << cfg.status().to_string();
  auto be = make_cpu_backend(2);
  test::RandomModel rm(*cfg, *be, 7);
  auto model = Qwen3VLModel::create(*be, *cfg, rm.weights);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();

  const int img = cfg->tokens.image_token_id, vs = cfg->tokens.vision_start_token_id,
            ve = cfg->tokens.vision_end_token_id;
  std::vector<ImageGrid> grids = {{1, 4, 6}, {1, 2, 4}};
  std::vector<int32_t> ids = {151644, 872, 198, vs};
  ids.insert(ids.end(), 6, img);
  ids.insert(ids.end(), {ve, 1234, 99, vs});
  ids.insert(ids.end(), 2, img);
  ids.insert(ids.end(), {ve, 40, 151645, 198});
  std::vector<std::vector<float>> px;
  std::mt19937 gen(3);
  std::uniform_real_distribution<float> d(-1, 1);
  std::vector<ImageInput> images;
  for (const ImageGrid& g : grids) {
    px.emplace_back(g.num_patches() * cfg->vision.patch_dim());
    for (float& v : px.back()) v = d(gen);
  }
  for (size_t i = 0; i < grids.size(); ++i) images.push_back({px[i].data(), grids[i]});

  std::map<std::string, std::vector<float>> stages;
  (*model)->set_debug_hook([&](std::string_view name, int index, const Tensor& t) {
    std::vector<float> h(t.numel());
    be->copy_to_host(h.data(), t);
    stages[std::string(name) + "." + std::to_string(index)] = h;
  });
  auto runner = SequenceRunner::create(**model, {});
  ASSERT_TRUE(runner.is_ok());
  auto logits = (*runner)->prefill(ids, images, 1);
  ASSERT_TRUE(logits.is_ok()) << logits.status().to_string();

  const VisionRef vref = vision_reference(*cfg, rm.weights, px, grids);
  auto expect_rel = [](const std::vector<float>& got, const Mat& want, const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    std::vector<float> w(want.begin(), want.end());
    const double rel = test::relative_l2(got.data(), w.data(), static_cast<int64_t>(w.size()));
    EXPECT_LT(rel, test::tol::kFp32StageRel) << what;
  };
  expect_rel(stages["vision.merger.-1"], vref.merged, "merger");
  for (size_t j = 0; j < vref.deepstack.size(); ++j)
    expect_rel(stages["vision.deepstack." + std::to_string(j)], vref.deepstack[j], "deepstack " + std::to_string(j));
  const Mat want = model_reference(*cfg, rm.weights, ids, vref, (*runner)->prompt_positions());
  expect_rel(*logits, want, "last-position logits");
}

INSTANTIATE_TEST_SUITE_P(TinyPresets, ModelReference, ::testing::Values("tiny", "tiny-untied"));

}  // namespace
}  // namespace qvl
