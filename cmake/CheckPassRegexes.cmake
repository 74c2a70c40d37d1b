# lossfns_check_pass_regexes(): every test of the calling directory has one pass regex. CTest
# reads PASS_REGULAR_EXPRESSION as a list and passes a test when any element matches, so a ';'
# left unescaped would make the part before it enough (it hid the exit-status checks of nine CLI
# tests). Called at the end of each directory that adds tests (get_test_property sees only the
# current directory's tests before CMake 3.28).
function(lossfns_check_pass_regexes)
  get_directory_property(tests TESTS)
  foreach(test IN LISTS tests)
    get_test_property(${test} PASS_REGULAR_EXPRESSION regexes)
    list(LENGTH regexes count)
    if(count GREATER 1)
      message(FATAL_ERROR "test ${test}: its PASS_REGULAR_EXPRESSION has an unescaped ';': write "
                          "\\; (in tests/trainer, distill_cli_output_test escapes it)")
    endif()
  endforeach()
endfunction()
