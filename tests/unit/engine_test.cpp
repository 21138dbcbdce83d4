// Engine tests on a fake model (engine_fakes.h). Expected tokens come from a direct simulation of
// the fake model in the test (no paging, no batching), so they check that continuous batching,
// chunked prefill, preemption and the page tables never change what a request produces.
#include <gtest/gtest.h>

#include <thread>

#include "engine/factory.h"
#include "unit/engine_fakes.h"

namespace qvl {
namespace {

using test::FakeRunner;
using test::kFakeEos;
using test::kFakeImageToken;
using namespace std::chrono_literals;

struct Built {
  std::unique_ptr<Engine> engine;
  FakeRunner* runner = nullptr;
};

Built build(EngineOptions options, int64_t max_pages = 256, int page_size = 4,
            std::function<void(FakeRunner&)> setup = nullptr) {
  auto runner = std::make_unique<FakeRunner>();
  if (setup) setup(*runner);
  KvLayout layout = runner->info().kv_layout;
  auto storage = make_host_region(layout.token_bytes() * page_size * max_pages);
  EXPECT_TRUE(storage.is_ok());
  auto pool = KvPagePool::create(std::move(storage).value(), layout, {page_size, max_pages, 8, 0});
  EXPECT_TRUE(pool.is_ok()) << pool.status().to_string();
  Built b;
  b.runner = runner.get();
  if (options.eos_token_ids.empty()) options.eos_token_ids = {kFakeEos};
  auto engine = make_engine(std::move(runner), std::move(pool).value(), test::fake_text_streams(), options);
  EXPECT_TRUE(engine.is_ok()) << engine.status().to_string();
  b.engine = std::move(engine).value();
  return b;
}

struct Outcome {
  std::vector<int32_t> ids;
  std::string text;
  FinishReason reason = FinishReason::kNone;
  Status error;
  Usage usage;
  int events = 0;
};

Outcome collect(RequestStream& stream, std::chrono::milliseconds timeout = 10s) {
  Outcome o;
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    auto ev = stream.next(50ms);
    if (!ev) continue;
    ++o.events;
    o.ids.insert(o.ids.end(), ev->token_ids.begin(), ev->token_ids.end());
    o.text += ev->text;
    if (ev->kind == GenerationEvent::Kind::kFinished) {
      o.reason = ev->finish_reason;
      o.error = ev->error;
      o.usage = ev->usage;
      return o;
    }
  }
  ADD_FAILURE() << "request did not finish";
  return o;
}

GenerationRequest request(std::vector<int32_t> prompt, int max_tokens, float temperature = 0,
                          std::optional<uint64_t> seed = std::nullopt);

// Closes the gate and parks the engine inside the forward of a one-token request, so that the
// requests submitted next all arrive before the following step is planned.
std::unique_ptr<RequestStream> park(Built& b) {
  b.runner->close_gate();
  auto s = b.engine->submit(request({1}, 1));
  EXPECT_TRUE(s.is_ok());
  b.runner->wait_started(1);
  return std::move(s).value();
}

GenerationRequest request(std::vector<int32_t> prompt, int max_tokens, float temperature,
                          std::optional<uint64_t> seed) {
  GenerationRequest r;
  r.prompt_ids = std::move(prompt);
  r.sampling.temperature = temperature;
  r.sampling.top_p = 1;
  r.sampling.top_k = 0;
  r.sampling.max_tokens = max_tokens;
  r.sampling.seed = seed;
  return r;
}

std::vector<int32_t> prompt_of(int n, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back((i * 7 + salt * 13) % 50);
  return p;
}

// The fake model run directly: greedy tokens for `prompt` (text only), stopping at eos unless
// ignore_eos. Position of token i is i + 5 (FakeRunner::prompt_positions).
std::vector<int32_t> simulate_greedy(const std::vector<int32_t>& prompt, int max_tokens, bool ignore_eos) {
  std::vector<std::pair<int32_t, int32_t>> context;
  for (size_t i = 0; i < prompt.size(); ++i) context.push_back({prompt[i], static_cast<int32_t>(i) + 5});
  std::vector<int32_t> out;
  while (static_cast<int>(out.size()) < max_tokens) {
    auto l = test::fake_logits(context);
    int32_t next = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
    out.push_back(next);
    if (next == kFakeEos && !ignore_eos) break;
    context.push_back({next, static_cast<int32_t>(context.size()) + 5});
  }
  return out;
}

TEST(Engine, GreedyTokensMatchTheModelRunDirectly) {
  EngineOptions opt;
  opt.max_running = 4;
  opt.max_step_tokens = 8;  // the 21-token prompt is prefilled in 3 chunks
  auto b = build(opt);
  auto prompt = prompt_of(21, 1);
  auto req = request(prompt, 12);
  req.sampling.ignore_eos = true;
  auto stream = b.engine->submit(req);
  ASSERT_TRUE(stream.is_ok()) << stream.status().to_string();
  Outcome o = collect(**stream);
  EXPECT_EQ(o.reason, FinishReason::kLength);
  EXPECT_EQ(o.ids, simulate_greedy(prompt, 12, true));
  EXPECT_EQ(o.usage.prompt_tokens, 21);
  EXPECT_EQ(o.usage.completion_tokens, 12);
  std::string text;
  for (int32_t t : o.ids) text += '<' + std::to_string(t) + '>';  // chars: "<" + string trips GCC 12's -Wrestrict
  EXPECT_EQ(o.text, text);
  auto steps = b.runner->steps();
  ASSERT_GE(steps.size(), 3u);
  EXPECT_EQ(steps[0].num_tokens, 8);
  EXPECT_EQ(steps[1].num_tokens, 8);
  EXPECT_EQ(steps[2].num_tokens, 5);  // the last chunk, whose logits give the first token
}

// Runs `reqs` concurrently and returns each outcome.
std::vector<Outcome> run_all(Engine& engine, const std::vector<GenerationRequest>& reqs) {
  std::vector<std::unique_ptr<RequestStream>> streams;
  for (const auto& r : reqs) {
    auto s = engine.submit(r);
    EXPECT_TRUE(s.is_ok()) << s.status().to_string();
    streams.push_back(std::move(s).value());
  }
  std::vector<Outcome> out;
  for (auto& s : streams) out.push_back(collect(*s));
  return out;
}

TEST(Engine, SameTokensAloneAndInsideABusyBatch) {
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 8; ++i) {
    auto r = request(prompt_of(5 + 3 * i, i), 10 + i, i % 2 ? 0.9f : 0.0f, 1000 + i);
    r.sampling.ignore_eos = true;
    r.sampling.top_k = i % 3 == 0 ? 10 : 0;
    reqs.push_back(r);
  }
  std::vector<Outcome> alone;
  {
    EngineOptions opt;
    opt.max_running = 1;
    auto b = build(opt);
    for (const auto& r : reqs) alone.push_back(run_all(*b.engine, {r})[0]);
  }
  for (int i = 0; i < 8; i += 2) EXPECT_EQ(alone[i].ids, simulate_greedy(reqs[i].prompt_ids, 10 + i, true));
  // Busy: 4 running at once, 6-token steps (chunked prefill beside decodes) and a 16-page pool
  // of 4 tokens that cannot hold them all (preemption and recomputation).
  EngineOptions opt;
  opt.max_running = 4;
  opt.max_step_tokens = 6;
  auto b = build(opt, 16, 4);
  auto busy = run_all(*b.engine, reqs);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(busy[i].ids, alone[i].ids) << "request " << i;
    EXPECT_EQ(busy[i].text, alone[i].text) << "request " << i;
    EXPECT_EQ(busy[i].reason, FinishReason::kLength);
  }
  int rows = 0, unique_rows = 0;
  for (const auto& s : b.runner->steps()) rows += s.num_tokens;
  for (int i = 0; i < 8; ++i) unique_rows += static_cast<int>(reqs[i].prompt_ids.size()) + 10 + i - 1;
  EXPECT_GT(rows, unique_rows) << "the small pool should have forced a recomputation";
  EXPECT_EQ(b.engine->stats().kv_pages_used, 0);
}

TEST(Engine, SameSeedSameTokensDifferentSeedDifferentTokens) {
  auto b = build(EngineOptions{});
  auto r1 = request(prompt_of(6, 2), 24, 1.0f, 7);
  r1.sampling.ignore_eos = true;
  auto r3 = r1;
  r3.sampling.seed = 8;
  auto out = run_all(*b.engine, {r1, r1, r3});
  EXPECT_EQ(out[0].ids, out[1].ids);
  EXPECT_NE(out[0].ids, out[2].ids);
}

// Logits that make `script[k]` the argmax for the k-th generated token (k counted from the
// context length minus the prompt length).
std::function<std::vector<float>(const std::vector<std::pair<int32_t, int32_t>>&)> scripted(
    size_t prompt_len, std::vector<int32_t> script) {
  return [prompt_len, script](const std::vector<std::pair<int32_t, int32_t>>& ctx) {
    std::vector<float> l(test::kFakeVocab, 0.0f);
    size_t k = ctx.size() - prompt_len;
    l[script[std::min(k, script.size() - 1)]] = 5.0f;
    return l;
  };
}

TEST(Engine, StopsOnEosStopStringAndMaxTokens) {
  auto b = build(EngineOptions{}, 256, 4, [](FakeRunner& r) { r.next_logits_ = scripted(4, {5, 6, kFakeEos, 9}); });
  {
    Outcome o = run_all(*b.engine, {request({1, 2, 3, 4}, 10)})[0];
    EXPECT_EQ(o.reason, FinishReason::kStop);
    EXPECT_EQ(o.ids, (std::vector<int32_t>{5, 6, kFakeEos}));  // eos is a completion token
    EXPECT_EQ(o.text, "<5><6>");                               // but has no text
    EXPECT_EQ(o.usage.completion_tokens, 3);
  }
  {
    auto r = request({1, 2, 3, 4}, 10);
    r.sampling.ignore_eos = true;
    Outcome o = run_all(*b.engine, {r})[0];
    EXPECT_EQ(o.reason, FinishReason::kLength);
    EXPECT_EQ(o.ids, (std::vector<int32_t>{5, 6, kFakeEos, 9, 9, 9, 9, 9, 9, 9}));
  }
  {
    auto r = request({1, 2, 3, 4}, 10);
    r.sampling.stop = {"6>"};
    Outcome o = run_all(*b.engine, {r})[0];
    EXPECT_EQ(o.reason, FinishReason::kStop);
    EXPECT_EQ(o.ids, (std::vector<int32_t>{5, 6}));
    EXPECT_EQ(o.text, "<5><");  // the text before the stop string, never the stop string
  }
  {
    Outcome o = run_all(*b.engine, {request({1, 2, 3, 4}, 2)})[0];
    EXPECT_EQ(o.reason, FinishReason::kLength);
    EXPECT_EQ(o.ids, (std::vector<int32_t>{5, 6}));
    EXPECT_EQ(o.text, "<5><6>");
  }
}

TEST(Engine, RefusesWhatCouldNeverFitWithTheNumbers) {
  EngineOptions opt;
  opt.max_context = 64;
  auto b = build(opt, 10, 4);  // 40 tokens of KV
  auto too_long = b.engine->submit(request(prompt_of(50, 0), 20));
  ASSERT_FALSE(too_long.is_ok());
  EXPECT_EQ(too_long.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(
      too_long.status().message().find("prompt of 50 tokens + max_tokens 20 = 70 tokens exceeds the context of 64"),
      std::string::npos)
      << too_long.status().message();
  auto too_big = b.engine->submit(request(prompt_of(30, 0), 20));
  ASSERT_FALSE(too_big.is_ok());
  EXPECT_EQ(too_big.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(too_big.status().message().find("50 tokens need 13 KV pages but the cache holds 10 pages (40 tokens)"),
            std::string::npos)
      << too_big.status().message();
  auto bad_images = b.engine->submit(request({1, kFakeImageToken, kFakeImageToken, 2}, 4));
  ASSERT_FALSE(bad_images.is_ok());
  EXPECT_NE(bad_images.status().message().find("1 image pad runs but 0 images"), std::string::npos);
  auto bad_token = b.engine->submit(request({1, 64}, 4));
  ASSERT_FALSE(bad_token.is_ok());
  EXPECT_NE(bad_token.status().message().find("id 64 outside the vocabulary of 64"), std::string::npos);
}

TEST(Engine, SequencesJoinAndLeaveAtTokenBoundaries) {
  auto ra = request(prompt_of(6, 1), 8), rb = request(prompt_of(5, 2), 2);
  ra.sampling.ignore_eos = rb.sampling.ignore_eos = true;
  std::unique_ptr<RequestStream> bb;
  Engine* engine = nullptr;
  // B arrives while A's third forward runs: it must join at the next token boundary.
  auto b = build(EngineOptions{}, 256, 4, [&](FakeRunner& r) {
    r.on_forward_ = [&](size_t index) {
      if (index == 2) bb = std::move(engine->submit(rb)).value();
    };
  });
  engine = b.engine.get();
  auto a = b.engine->submit(ra);
  ASSERT_TRUE(a.is_ok());
  Outcome oa = collect(**a);
  b.runner->wait_steps(8);
  ASSERT_NE(bb, nullptr);
  Outcome ob = collect(*bb);
  EXPECT_EQ(oa.ids, simulate_greedy(ra.prompt_ids, 8, true));
  EXPECT_EQ(ob.ids, simulate_greedy(rb.prompt_ids, 2, true));
  auto steps = b.runner->steps();
  ASSERT_EQ(steps.size(), 8u);  // A: 1 prefill + 7 decodes; B rides along: prefill + 1 decode
  EXPECT_EQ(steps[2].seqs.size(), 1u);
  // Step 4: A decodes one token while B's whole prompt is prefilled in the same forward.
  ASSERT_EQ(steps[3].seqs.size(), 2u);
  EXPECT_EQ(steps[3].seqs[0].second, 1);
  EXPECT_EQ(steps[3].seqs[1].second, 5);
  ASSERT_EQ(steps[4].seqs.size(), 2u);  // both decode
  EXPECT_EQ(steps[5].seqs.size(), 1u);  // B left after its 2 tokens; A goes on
}

TEST(Engine, QueuesBeyondTheRunningBatchInArrivalOrder) {
  EngineOptions opt;
  opt.max_running = 2;
  auto b = build(opt);
  auto parked = park(b);
  std::vector<std::unique_ptr<RequestStream>> streams;
  for (int i = 0; i < 4; ++i) {
    auto r = request(prompt_of(4, i), 3 + i);
    r.sampling.ignore_eos = true;
    streams.push_back(std::move(b.engine->submit(r)).value());
  }
  EXPECT_EQ(b.engine->stats().queued, 4);
  b.runner->allow(1);  // the parked step ends; the next one admits requests 0 and 1
  b.runner->wait_started(2);
  for (int i = 0; i < 1000 && b.engine->stats().running != 2; ++i) std::this_thread::sleep_for(1ms);
  EngineStats st = b.engine->stats();
  EXPECT_EQ(st.running, 2);
  EXPECT_EQ(st.queued, 2);
  b.runner->open_gate();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(collect(*streams[i]).ids.size(), size_t(3 + i));
  auto steps = b.runner->steps();
  ASSERT_GE(steps.size(), 6u);
  EXPECT_EQ(steps[1].seqs.size(), 2u);
  // Request 0 leaves after 3 tokens (steps 2-4); request 2 (first token 2·13 % 50 = 26) joins
  // at step 5 beside request 1's last decode, and request 3 (39) when request 1 leaves.
  ASSERT_EQ(steps[4].seqs.size(), 2u);
  EXPECT_EQ(steps[4].seqs[1], std::make_pair(26, 4));
  ASSERT_EQ(steps[5].seqs.size(), 2u);
  EXPECT_EQ(steps[5].seqs[1], std::make_pair(39, 4));
  for (const auto& s : steps) EXPECT_LE(s.seqs.size(), 2u);
}

TEST(Engine, CancellationFreesPagesWithinOneStep) {
  auto b = build(EngineOptions{}, 256, 4);
  auto parked = park(b);
  auto ra = request(prompt_of(12, 1), 50), rb = request(prompt_of(8, 2), 50);
  ra.sampling.ignore_eos = rb.sampling.ignore_eos = true;
  auto a = std::move(b.engine->submit(ra)).value();
  auto bb = std::move(b.engine->submit(rb)).value();
  b.runner->allow(3);  // the parked step, A and B's prefill, one decode each
  b.runner->wait_started(4);
  // Step 4 is planned: A holds 14 tokens' pages (4 of 4 tokens), B 10 tokens' (3).
  for (int i = 0; i < 1000 && b.engine->stats().kv_pages_used != 7; ++i) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(b.engine->stats().kv_pages_used, 4 + 3);
  a->cancel();
  b.runner->allow(1);  // step 4 ends; the cancel is seen before step 5 is planned
  b.runner->wait_started(5);
  for (int i = 0; i < 1000 && b.engine->stats().kv_pages_used != 3; ++i) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(b.engine->stats().kv_pages_used, 3);  // only B's pages (11 tokens in step 5)
  Outcome oa = collect(*a);
  EXPECT_EQ(oa.reason, FinishReason::kCancelled);
  // Destroying a stream cancels too.
  bb.reset();
  b.runner->open_gate();
  for (int i = 0; i < 1000 && b.engine->stats().kv_pages_used != 0; ++i) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(b.engine->stats().kv_pages_used, 0);
  EXPECT_EQ(b.engine->stats().running, 0);
}

TEST(Engine, ShutdownWaitsForRunningWorkUntilTheDeadline) {
  auto b = build(EngineOptions{});
  b.runner->step_delay = 2ms;
  auto quick = request(prompt_of(4, 1), 5);
  quick.sampling.ignore_eos = true;
  auto slow = request(prompt_of(4, 2), 1000);
  slow.sampling.ignore_eos = true;
  auto c = build(EngineOptions{});
  c.runner->step_delay = 2ms;
  {
    auto s = std::move(b.engine->submit(quick)).value();
    b.engine->shutdown(10s);  // finishes the running request, well within the deadline
    Outcome o = collect(*s, 1s);
    EXPECT_EQ(o.reason, FinishReason::kLength);
    EXPECT_EQ(o.ids.size(), 5u);
    auto late = b.engine->submit(quick);
    ASSERT_FALSE(late.is_ok());
    EXPECT_EQ(late.status().code(), StatusCode::kUnavailable);
  }
  {
    auto s = std::move(c.engine->submit(slow)).value();
    c.runner->wait_steps(3);
    const auto t0 = std::chrono::steady_clock::now();
    c.engine->shutdown(100ms);  // 1000 tokens at >= 2 ms cannot finish: cancelled at the deadline
    const auto waited = std::chrono::steady_clock::now() - t0;
    EXPECT_LT(waited, 2s);
    EXPECT_GE(waited, 90ms);
    Outcome o = collect(*s, 1s);
    EXPECT_EQ(o.reason, FinishReason::kCancelled);
    EXPECT_GT(o.ids.size(), 0u);
    EXPECT_LT(o.ids.size(), 1000u);
  }
}

TEST(Engine, ImagesAreEncodedOneAtATimeAndFedAtTheirPads) {
  // Two requests with two images each (2 and 3 pad tokens), prefilled in small chunks together.
  auto make = [](int salt) {
    GenerationRequest r = request({1, 2, kFakeImageToken, kFakeImageToken, 3, kFakeImageToken, kFakeImageToken,
                                   kFakeImageToken, 4, static_cast<int32_t>(salt)},
                                  6);
    r.images = {test::fake_image(2, 4, 10.0f + salt), test::fake_image(2, 6, 20.0f + salt)};
    r.sampling.ignore_eos = true;
    return r;
  };
  // Reference: the context values the fake sees (1000·tag + row for image rows).
  auto expected = [](int salt) {
    std::vector<int32_t> values{1,
                                2,
                                (10 + salt) * 1000,
                                (10 + salt) * 1000 + 1,
                                3,
                                (20 + salt) * 1000,
                                (20 + salt) * 1000 + 1,
                                (20 + salt) * 1000 + 2,
                                4,
                                salt};
    return simulate_greedy(values, 6, true);
  };
  EngineOptions opt;
  opt.max_step_tokens = 3;
  opt.max_running = 2;
  auto b = build(opt);
  auto out = run_all(*b.engine, {make(5), make(7)});
  EXPECT_EQ(out[0].ids, expected(5));
  EXPECT_EQ(out[1].ids, expected(7));
  EXPECT_EQ(b.runner->max_live_features_.load(), 1);
  EXPECT_EQ(b.runner->live_features_.load(), 0);
}

TEST(Engine, FailuresEndTheRequestAndTheEngineKeepsServing) {
  auto b = build(EngineOptions{});
  auto bad_image = request({1, kFakeImageToken, 2}, 4);
  bad_image.images = {test::fake_image(2, 2, -1.0f)};  // the fake refuses negative tags
  Outcome o = run_all(*b.engine, {bad_image})[0];
  EXPECT_EQ(o.reason, FinishReason::kError);
  EXPECT_EQ(o.error.code(), StatusCode::kDataLoss);
  EXPECT_NE(o.error.message().find("image 1: fake: unreadable image"), std::string::npos) << o.error.message();

  b.runner->fail_next_ = true;
  o = run_all(*b.engine, {request({1, 2, 3}, 4)})[0];
  EXPECT_EQ(o.reason, FinishReason::kError);
  EXPECT_NE(o.error.message().find("injected failure"), std::string::npos);

  auto ok = request({1, 2, 3}, 4);
  ok.sampling.ignore_eos = true;
  o = run_all(*b.engine, {ok})[0];
  EXPECT_EQ(o.reason, FinishReason::kLength);
  EXPECT_EQ(o.ids, simulate_greedy({1, 2, 3}, 4, true));
  EXPECT_EQ(b.engine->stats().kv_pages_used, 0);
}

}  // namespace
}  // namespace qvl
