// `flat run conv`: the short convolution on a directory of .npy files.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

namespace flat::tool {

// args: everything after `run`, `conv` included. Reads x.npy [B, S, C], weight.npy [C, W] and
// optionally bias.npy [C], state0.npy [B, C, W-1], dy.npy [B, S, C] and (with dy) dstate.npy
// [B, C, W-1], and the sequence files (run_io.h's SequenceFiles: the states a row per sequence, or
// state0.npy and state.npy a pool); writes y.npy, state.npy (when W > 1) and, with dy, dx.npy,
// dweight.npy, dbias.npy (with a bias) and dstate0.npy (with state0). Returns 0, or 2 after a
// one-line error naming the file or option, with nothing written.
int run_conv_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace flat::tool
