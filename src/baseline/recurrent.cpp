#include "baseline/baselines.h"

#include <stdexcept>

namespace flat::baseline {

void recurrent_forward(const AdditiveParams&) { throw std::logic_error("recurrent_forward: not yet written"); }
void recurrent_backward(const AdditiveParams&) { throw std::logic_error("recurrent_backward: not yet written"); }

}  // namespace flat::baseline
