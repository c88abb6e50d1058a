/* placeholder: being written */
#include "status.h"
