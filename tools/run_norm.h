// `flat run norm_gate`: the output norm and gate on a directory of .npy files.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

namespace flat::tool {

// args: everything after `run`, `norm_gate` included. Reads x.npy [B, S, N, D], weight.npy [D]
// or [N, D] and optionally g.npy [B, S, N, D] (the gate) and dy.npy [B, S, N, D]; writes y.npy
// and, with dy, dx.npy, dg.npy (with a gate) and dweight.npy (weight's shape). Returns 0, or 2
// after a one-line error naming the file or option, with nothing written.
int run_norm_gate_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace flat::tool
