// The library's tensors that the Python front ends take under another name: flat.torch's and
// flat.jax's initial_state is the recurrence's h0 and the convolution's state0. Their errors name
// the argument as the caller passed it.
#pragma once

#include <string>
#include <string_view>
#include <utility>

namespace flat::python {

// A library message (flat::Error, "flat: <tensor>: ...") naming one of those tensors as its
// argument, whole ("flat: h0: ...") or a pool row ("flat: h0[3]: ..."), with the Python name in
// its place; any other message as it is.
inline std::string python_names(const std::string& message) {
  static constexpr std::pair<std::string_view, std::string_view> kNames[] = {{"h0", "initial_state"},
                                                                             {"state0", "initial_state"}};
  constexpr std::string_view prefix = "flat: ";
  if (message.compare(0, prefix.size(), prefix) != 0) return message;
  for (const auto& [library, python] : kNames) {
    const size_t end = prefix.size() + library.size();
    if (message.size() > end && message.compare(prefix.size(), library.size(), library) == 0 &&
        (message[end] == ':' || message[end] == '['))
      return std::string(prefix) + std::string(python) + message.substr(end);
  }
  return message;
}

}  // namespace flat::python
