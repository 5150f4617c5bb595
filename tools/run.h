// `flat run`: the command-line face of the kernels, on directories of .npy files.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

namespace flat::tool {

// args: everything after `run`. Returns the exit status: 0 on success, 2 on bad input (a
// one-line error naming the file is printed to err and nothing is written to the output dir).
int run_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace flat::tool
