// `flat bench`: times the kernels and their baselines in one process.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

namespace flat::tool {

// args: everything after `bench`. Returns the exit status.
int bench_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace flat::tool
