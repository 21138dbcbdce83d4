// WorkLane: results come back to the caller, exceptions are rethrown there, and every job runs on
// the lane's one thread, one at a time, whatever thread submitted it.
#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <stdexcept>
#include <vector>

#include "server/work_lane.h"

namespace qvl::server {
namespace {

TEST(WorkLane, RunsJobsOneAtATimeOnItsOwnThread) {
  WorkLane lane;
  EXPECT_EQ(lane.run([] { return 6 * 7; }), 42);
  EXPECT_THROW(lane.run([]() -> int { throw std::runtime_error("boom"); }), std::runtime_error);

  std::atomic<int> active{0}, max_active{0};
  std::mutex mu;
  std::set<std::thread::id> ids;
  std::vector<std::thread> callers;
  for (int c = 0; c < 8; ++c)
    callers.emplace_back([&] {
      for (int i = 0; i < 50; ++i)
        lane.run([&] {
          int now = ++active;
          int prev = max_active.load();
          while (now > prev && !max_active.compare_exchange_weak(prev, now)) {
          }
          {
            std::lock_guard<std::mutex> lock(mu);
            ids.insert(std::this_thread::get_id());
          }
          --active;
          return 0;
        });
    });
  for (auto& t : callers) t.join();
  EXPECT_EQ(max_active.load(), 1);  // never two jobs at once
  ASSERT_EQ(ids.size(), 1u);        // always the same thread
  EXPECT_NE(*ids.begin(), std::this_thread::get_id());
}

}  // namespace
}  // namespace qvl::server
