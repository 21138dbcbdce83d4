// WorkLane: runs submitted functions one at a time, in order, on one thread of its own.
//
// Why the server needs it: image preprocessing parallelises with OpenMP, and an OpenMP runtime
// gives every distinct thread that opens a parallel region a team of its own that lives as long
// as that thread. Run from the HTTP workers, that is one team per worker: up to
// http_threads × cores threads, all competing for the cores at once, and one full-resolution
// decoded image per worker in memory. Funnelling the image work through one lane keeps one
// OpenMP team (created once, so the thread count stays fixed), one decoded image at a time, and
// still uses every core for each image.
//
// run() blocks the caller until its function has run and returns its result; exceptions thrown
// by the function (a CheckFailure) are rethrown in the caller. The destructor finishes queued
// work and joins the thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

namespace qvl::server {

class WorkLane {
 public:
  WorkLane() : thread_([this] { loop(); }) {}
  ~WorkLane() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  WorkLane(const WorkLane&) = delete;
  WorkLane& operator=(const WorkLane&) = delete;

  template <typename F>
  auto run(F fn) -> decltype(fn()) {
    std::packaged_task<decltype(fn())()> task(std::move(fn));
    auto result = task.get_future();
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.emplace_back([&task] { task(); });
    }
    cv_.notify_one();
    return result.get();  // the task lives on this stack until it has run
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything queued has run
      std::function<void()> job = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      job();
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::thread thread_;  // last: starts after the members it uses exist
};

}  // namespace qvl::server
