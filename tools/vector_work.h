// `flat bench`'s vector work: a pass's time with its chunk products taken out
// (tools/vector_work_stages.h), the work beside the products that a faster product unit leaves in
// place. Timing only: the results are wrong. It lives in the tool, never in the library: no
// target list, FLAT_ISA or call of the library reaches it.
#pragma once

#include <optional>

#include "cpu/targets.h"

namespace flat::tool {

// `target` with its chunk stages' products replaced by a kernel that only zeroes C where the
// product would write it (its convolution, norm and microkernel table as they are); empty for a
// target built without such stages (the software models, whose time is the model's, and every
// target under the sanitizers, whose build compiles none).
std::optional<cpu::Target> vector_work_target(const cpu::Target& target);

}  // namespace flat::tool
