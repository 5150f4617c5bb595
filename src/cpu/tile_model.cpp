// The model of the tile unit's state (kernels/tiles__model.h): one per thread, for the whole
// process, as the tile registers are. Compiled with the library's baseline flags, with the tests.
#include "cpu/kernels/tiles__model.h"

namespace flat::cpu {

TileModelState& tile_model_state() {
  thread_local TileModelState state;
  return state;
}

}  // namespace flat::cpu
