#include "cpu/parallel.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace flat::cpu {
namespace {

thread_local bool in_pool_worker = false;

// How long a worker waiting for work, and a caller waiting for its workers, keep polling before
// they sleep. Waking a sleeping thread takes tens of microseconds on a VM (its vCPU halts when
// idle), which is most of a one-token decode step; back-to-back calls (a model's layers) find the
// workers still polling.
constexpr auto kPollFor = std::chrono::microseconds(200);

inline void pause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Polls done() for up to kPollFor; true when it came true.
template <class Done>
bool poll(Done&& done) {
  const auto until = std::chrono::steady_clock::now() + kPollFor;
  for (int spins = 0;; ++spins) {
    if (done()) return true;
    pause();
    if (spins % 64 == 63 && std::chrono::steady_clock::now() > until) return false;
  }
}

// Worker threads that live as long as the process and end with it: never stopped nor joined (see
// run_on_pool). One caller at a time; the caller runs part 0 itself.
class ThreadPool {
 public:
  bool run(int parts, const std::function<void(int64_t)>& part) {
    std::unique_lock<std::mutex> caller(busy_, std::try_to_lock);
    if (!caller.owns_lock()) return false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      while (int(threads_.size()) < parts - 1) {
        const int index = int(threads_.size()) + 1;
        threads_.emplace_back([this, index] { work(index); });
      }
      part_ = &part;
      parts_ = parts;
      pending_.store(parts - 1, std::memory_order_relaxed);
      round_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    part(0);
    if (!poll([&] { return pending_.load(std::memory_order_acquire) == 0; })) {
      std::unique_lock<std::mutex> lock(mutex_);
      done_.wait(lock, [&] { return pending_.load(std::memory_order_acquire) == 0; });
    }
    return true;
  }

 private:
  void work(int index) {
    in_pool_worker = true;
    uint64_t seen = 0;
    for (;;) {
      if (!poll([&] { return round_.load(std::memory_order_acquire) != seen; })) {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return round_.load(std::memory_order_acquire) != seen; });
      }
      const std::function<void(int64_t)>* part;
      int parts;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        seen = round_.load(std::memory_order_relaxed);
        part = part_;
        parts = parts_;
      }
      if (index >= parts) continue;
      (*part)(index);
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lock(mutex_);
        done_.notify_one();
      }
    }
  }

  std::mutex busy_;   // held by the calling thread for a whole run
  std::mutex mutex_;  // guards the run's description and the sleeping
  std::condition_variable wake_, done_;
  std::vector<std::thread> threads_;  // worker i + 1 runs part i + 1
  const std::function<void(int64_t)>* part_ = nullptr;
  int parts_ = 0;
  std::atomic<int> pending_{0};
  std::atomic<uint64_t> round_{0};
};

}  // namespace

int max_threads() {
  static const int most = 4 * int(std::max(1u, std::thread::hardware_concurrency()));
  return most;
}

bool run_on_pool(int parts, const std::function<void(int64_t)>& part) {
  if (in_pool_worker) return false;
  // Never destroyed, so the process's exit joins no thread: a join at exit aborted a forked child,
  // whose copy of the pool names threads it does not have (std::system_error in a destructor), and
  // would make the exit wait on the workers of a caller still running on another thread.
  static ThreadPool& pool = *new ThreadPool;
  // A forked child has the pool's memory but not its threads.
  static const pid_t owner = getpid();
  if (getpid() != owner) return false;
  return pool.run(parts, part);
}

}  // namespace flat::cpu
