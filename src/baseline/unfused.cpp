#include "baseline/baselines.h"

#include <stdexcept>

namespace flat::baseline {

void unfused_forward(const AdditiveParams&) { throw std::logic_error("unfused_forward: not yet written"); }
void unfused_backward(const AdditiveParams&) { throw std::logic_error("unfused_backward: not yet written"); }

}  // namespace flat::baseline
