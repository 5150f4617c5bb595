# Writes ctest's tests for a GoogleTest executable as groups of its tests: consecutive tests of one
# suite, at most GROUP_SIZE to a process, each group one ctest test named after its suite and its
# first and last tests. For the sanitized build, where each process's start-up (the sanitizers'
# shadow memory, a 120 MB binary) takes about 0.1 s: one process a test spent 180 of the sanitized
# suite's 836 CPU-seconds starting up (EPYC Zen 3, 1,824 tests).
# Script mode: cmake -DTEST_EXECUTABLE=... -DGROUP_SIZE=... -DTIMEOUT=... -DOUTPUT=... -P gtest_groups.cmake
execute_process(COMMAND "${TEST_EXECUTABLE}" --gtest_list_tests OUTPUT_VARIABLE listing RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "${TEST_EXECUTABLE} --gtest_list_tests failed (${status})")
endif()

set(script "")
set(suite "")
set(group "")
set(first "")
set(last "")
set(count 0)
macro(write_group)
  if(count GREATER 0)
    string(APPEND script "add_test([=[${suite}.${first} .. ${last}]=] \"${TEST_EXECUTABLE}\" [=[--gtest_filter=${group}]=])\n"
                         "set_tests_properties([=[${suite}.${first} .. ${last}]=] PROPERTIES TIMEOUT ${TIMEOUT})\n")
  endif()
  set(group "")
  set(count 0)
endmacro()

string(REPLACE ";" "," listing "${listing}")  # no list separators inside the lines
string(REPLACE "\n" ";" lines "${listing}")
foreach(line IN LISTS lines)
  if(line MATCHES "^([^ ]+)\\.")  # a suite: "Suite." or "Prefix/Suite.", maybe a comment after
    write_group()
    set(suite "${CMAKE_MATCH_1}")
  elseif(line MATCHES "^  ([^ ]+)")  # one of its tests, maybe a comment after
    if(count EQUAL 0)
      set(first "${CMAKE_MATCH_1}")
      set(group "${suite}.${CMAKE_MATCH_1}")
    else()
      string(APPEND group ":${suite}.${CMAKE_MATCH_1}")
    endif()
    set(last "${CMAKE_MATCH_1}")
    math(EXPR count "${count} + 1")
    if(count EQUAL GROUP_SIZE)
      write_group()
    endif()
  endif()
endforeach()
write_group()
file(WRITE "${OUTPUT}" "${script}")
