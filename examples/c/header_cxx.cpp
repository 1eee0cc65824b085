// The header compiles as C++ and survives being included twice.
#include "correx.h"
#include "correx.h"

int main() {
    return correx_abi_version() == CORREX_ABI_VERSION ? 0 : 1;
}
