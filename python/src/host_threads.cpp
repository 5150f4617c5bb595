#include "host_threads.h"

#include <omp.h>

#include <atomic>

namespace flat::python {

// OpenMP may give the region fewer threads than asked: every thread takes the parts
// p = its number, + the team's size, ..., so each part runs once whatever the team.
namespace {
std::atomic<int> last_team{0};
}

void openmp_parallel_for(int parts, const std::function<void(int)>& run_part) {
#pragma omp parallel num_threads(parts)
  {
    const int team = omp_get_num_threads();
    if (omp_get_thread_num() == 0) last_team = team;
    for (int part = omp_get_thread_num(); part < parts; part += team) run_part(part);
  }
}

int last_openmp_team() { return last_team; }

}  // namespace flat::python
