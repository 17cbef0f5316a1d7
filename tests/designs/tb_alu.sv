`timescale 1ns/1ps
module tb;
  reg [1:0] op = 0; reg [3:0] a = 0, b = 0; reg sat = 0;
  wire [3:0] y; wire z;
  alu uut (.op(op), .a(a), .b(b), .sat(sat), .y(y), .z(z));
  initial begin
    #10 a = 4'd3; b = 4'd2;             // op 0, sat 0: 5
    #10 sat = 1;                         // op 0, sat 1, no carry: 5
    #10 op = 2'd2;                       // a > b, sat: y = a = 3
    #10 a = 4'd1;                        // a <= b: y = 0
    #10 $finish;
  end
endmodule
