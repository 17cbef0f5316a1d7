`timescale 1ns/1ps
module tb;
  reg a = 0, b = 0, c = 0, d = 0;
  wire x, y;
  andor uut (.a(a), .b(b), .c(c), .d(d), .x(x), .y(y));
  initial begin
    #10 a = 1; b = 1; c = 1;     // a b c d = 1110
    #10 b = 0;                   // 1010
    #10 a = 0; d = 1;            // 0011
    #10 $finish;
  end
endmodule
